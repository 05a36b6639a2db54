"""User-defined orders shared by the property tests: what a user of epochstream might bring.

- :class:`LexPair` — lexicographic pairs, a total order on tuples that is not ``TOTAL``, with a
  sort key; :class:`LexPairNoKey` — the same without a key (exercises the plain-set paths);
- :class:`Divides` — divisibility on 1..12, a partial order without a sort key.
"""


class LexPairNoKey:
    """Lexicographic order on pairs, no ``key``: epochstream falls back to its key-less paths."""

    name = "lex2"
    minimum = (0, 0)
    universe = [(a, b) for a in range(3) for b in range(3)]

    @staticmethod
    def le(a, b):
        return a <= b

    @staticmethod
    def lt(a, b):
        return a < b


class LexPair(LexPairNoKey):
    """Lexicographic pairs with a sort key (the tuple itself: a linear extension)."""

    @staticmethod
    def key(t):
        return t


class Divides:
    """Divisibility on 1..12 (a partial order without a sort key: exercises the plain-set path)."""

    name = "divides"
    minimum = 1
    universe = list(range(1, 13))

    @staticmethod
    def le(a, b):
        return b % a == 0

    @staticmethod
    def lt(a, b):
        return a != b and b % a == 0
