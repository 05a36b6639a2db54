"""A publisher that becomes a zombie (tests/test_fencing.py): it registers partition 0 of
topic ``z`` in the catalog at URL with a lease of LEASE seconds and sends one epoch every 20 ms
(records tagged ``zombie``), printing ``sent E``, until the publisher refuses: then it prints
``fenced MESSAGE`` and exits 3 (any other error: ``error ...``, exit 4).

    python tests/fencing_peer.py URL LEASE
"""

import sys
import time

from epochstream import Catalog, Fenced, Publisher


def main() -> int:
    url, lease = sys.argv[1], float(sys.argv[2])
    pub = Publisher("z", catalog=Catalog(url, lease=lease))
    print("registered", pub.incarnation, flush=True)
    e = 0
    try:
        while True:
            pub.send(e, [{"from": "zombie", "e": e}])
            pub.advance_to(e + 1)
            print("sent", e, flush=True)
            e += 1
            time.sleep(0.02)
    except Fenced as err:
        print("fenced", str(err).replace("\n", " "), flush=True)
        return 3
    except Exception as err:  # noqa: BLE001 - reported to the test
        print("error", type(err).__name__, str(err).replace("\n", " "), flush=True)
        return 4


if __name__ == "__main__":
    sys.exit(main())
