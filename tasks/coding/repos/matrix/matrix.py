"""A small immutable matrix of numbers: arithmetic, transpose, determinant and powers."""


class Matrix:
    """A rows x cols matrix stored as a tuple of row tuples."""

    def __init__(self, rows: list[list[float]]) -> None:
        if not rows or not rows[0]:
            raise ValueError("a matrix needs at least one row and one column")
        width = len(rows[0])
        if any(len(row) != width for row in rows):
            raise ValueError("all rows must have the same length")
        self._rows = tuple(tuple(row) for row in rows)

    @classmethod
    def identity(cls, n: int) -> "Matrix":
        return cls([[1 if i == j else 0 for j in range(n)] for i in range(n)])

    @classmethod
    def zeros(cls, rows: int, cols: int) -> "Matrix":
        return cls([[0] * cols for _ in range(rows)])

    @property
    def shape(self) -> tuple[int, int]:
        return len(self._rows), len(self._rows[0])

    def row(self, i: int) -> tuple[float, ...]:
        return self._rows[i]

    def column(self, j: int) -> tuple[float, ...]:
        return tuple(row[j] for row in self._rows)

    def __getitem__(self, index: tuple[int, int]) -> float:
        i, j = index
        return self._rows[i][j]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Matrix) and self._rows == other._rows

    def __repr__(self) -> str:
        return f"Matrix({[list(row) for row in self._rows]})"

    def __add__(self, other: "Matrix") -> "Matrix":
        if self.shape != other.shape:
            raise ValueError(f"cannot add shapes {self.shape} and {other.shape}")
        return Matrix(
            [[a + b for a, b in zip(r, s, strict=True)] for r, s in zip(self._rows, other._rows, strict=True)]
        )

    def __sub__(self, other: "Matrix") -> "Matrix":
        if self.shape != other.shape:
            raise ValueError(f"cannot subtract shapes {self.shape} and {other.shape}")
        return Matrix(
            [[a - b for a, b in zip(r, s, strict=True)] for r, s in zip(self._rows, other._rows, strict=True)]
        )

    def scale(self, factor: float) -> "Matrix":
        return Matrix([[factor * a for a in row] for row in self._rows])

    def __matmul__(self, other: "Matrix") -> "Matrix":
        n, m = self.shape
        m2, p = other.shape
        if m != m2:
            raise ValueError(f"cannot multiply shapes {self.shape} and {other.shape}")
        a, b = self._rows, other._rows
        return Matrix([[sum(a[i][k] * b[k][j] for k in range(m)) for j in range(p)] for i in range(n)])

    def transpose(self) -> "Matrix":
        rows, cols = self.shape
        return Matrix([[self._rows[i][j] for i in range(rows)] for j in range(cols)])

    def trace(self) -> float:
        rows, cols = self.shape
        if rows != cols:
            raise ValueError("trace needs a square matrix")
        return sum(self._rows[i][i] for i in range(rows))

    def minor(self, i: int, j: int) -> "Matrix":
        """The matrix without row ``i`` and column ``j``."""
        return Matrix([row[:j] + row[j + 1 :] for k, row in enumerate(self._rows) if k != i])

    def determinant(self) -> float:
        """Laplace expansion along the first row."""
        rows, cols = self.shape
        if rows != cols:
            raise ValueError("determinant needs a square matrix")
        if rows == 1:
            return self._rows[0][0]
        if rows == 2:
            (a, b), (c, d) = self._rows
            return a * d - b * c
        total = 0
        for j in range(cols):
            sign = -1 if j % 2 else 1
            total += sign * self._rows[0][j] * self.minor(0, j).determinant()
        return total

    def power(self, exponent: int) -> "Matrix":
        """The matrix multiplied by itself ``exponent`` times (0 gives the identity)."""
        rows, cols = self.shape
        if rows != cols:
            raise ValueError("power needs a square matrix")
        if exponent < 0:
            raise ValueError("exponent must be >= 0")
        result = Matrix.identity(rows)
        base = self
        while exponent > 0:
            if exponent % 2 == 1:
                result = result @ base
            base = base @ base
            exponent //= 2
        return result
