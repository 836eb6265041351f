import pytest
from matrix import Matrix


def test_shape_and_indexing():
    m = Matrix([[1, 2, 3], [4, 5, 6]])
    assert m.shape == (2, 3)
    assert m[0, 0] == 1
    assert m[1, 2] == 6
    assert m.row(1) == (4, 5, 6)
    assert m.column(1) == (2, 5)


def test_invalid_construction():
    with pytest.raises(ValueError):
        Matrix([])
    with pytest.raises(ValueError):
        Matrix([[]])
    with pytest.raises(ValueError):
        Matrix([[1, 2], [3]])


def test_identity_and_zeros():
    assert Matrix.identity(3) == Matrix([[1, 0, 0], [0, 1, 0], [0, 0, 1]])
    assert Matrix.zeros(2, 3) == Matrix([[0, 0, 0], [0, 0, 0]])


def test_equality():
    assert Matrix([[1, 2]]) == Matrix([[1, 2]])
    assert Matrix([[1, 2]]) != Matrix([[2, 1]])
    assert Matrix([[1, 2]]) != [[1, 2]]


def test_repr():
    assert repr(Matrix([[1, 2], [3, 4]])) == "Matrix([[1, 2], [3, 4]])"


def test_add_and_subtract():
    a = Matrix([[1, 2], [3, 4]])
    b = Matrix([[10, 20], [30, 40]])
    assert a + b == Matrix([[11, 22], [33, 44]])
    assert b - a == Matrix([[9, 18], [27, 36]])
    with pytest.raises(ValueError):
        a + Matrix([[1, 2, 3]])
    with pytest.raises(ValueError):
        a - Matrix([[1], [2]])


def test_scale():
    assert Matrix([[1, -2], [0, 3]]).scale(3) == Matrix([[3, -6], [0, 9]])


def test_matmul():
    a = Matrix([[1, 2, 3], [4, 5, 6]])
    b = Matrix([[7, 8], [9, 10], [11, 12]])
    assert a @ b == Matrix([[58, 64], [139, 154]])
    assert b @ a == Matrix([[39, 54, 69], [49, 68, 87], [59, 82, 105]])


def test_matmul_shape_mismatch():
    with pytest.raises(ValueError):
        Matrix([[1, 2]]) @ Matrix([[1, 2]])


def test_identity_is_neutral():
    m = Matrix([[2, 3], [5, 7]])
    assert Matrix.identity(2) @ m == m
    assert m @ Matrix.identity(2) == m


def test_transpose():
    assert Matrix([[1, 2, 3], [4, 5, 6]]).transpose() == Matrix([[1, 4], [2, 5], [3, 6]])
    assert Matrix([[1], [2]]).transpose() == Matrix([[1, 2]])


def test_trace():
    assert Matrix([[1, 2], [3, 4]]).trace() == 5
    assert Matrix.identity(4).trace() == 4
    with pytest.raises(ValueError):
        Matrix([[1, 2]]).trace()


def test_minor():
    m = Matrix([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    assert m.minor(0, 0) == Matrix([[5, 6], [8, 9]])
    assert m.minor(1, 2) == Matrix([[1, 2], [7, 8]])
    assert m.minor(2, 1) == Matrix([[1, 3], [4, 6]])


def test_determinant_small():
    assert Matrix([[7]]).determinant() == 7
    assert Matrix([[1, 2], [3, 4]]).determinant() == -2
    assert Matrix([[4, 6], [3, 8]]).determinant() == 14


def test_determinant_three_and_four():
    assert Matrix([[6, 1, 1], [4, -2, 5], [2, 8, 7]]).determinant() == -306
    assert Matrix([[2, 0, 0], [0, 3, 0], [0, 0, 4]]).determinant() == 24
    m = Matrix([[1, 0, 2, -1], [3, 0, 0, 5], [2, 1, 4, -3], [1, 0, 5, 0]])
    assert m.determinant() == 30


def test_determinant_needs_square():
    with pytest.raises(ValueError):
        Matrix([[1, 2, 3], [4, 5, 6]]).determinant()


def test_power():
    fib = Matrix([[1, 1], [1, 0]])
    assert fib.power(0) == Matrix.identity(2)
    assert fib.power(1) == fib
    assert fib.power(2) == Matrix([[2, 1], [1, 1]])
    assert fib.power(10) == Matrix([[89, 55], [55, 34]])
    with pytest.raises(ValueError):
        fib.power(-1)
