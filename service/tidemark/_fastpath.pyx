# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The per-change path in compiled code: pgoutput tuple data in, Arrow buffers out.

A leaf: it imports nothing of tidemark's. The pure-Python code it speeds up stays the
reference (``pgoutput/decoder.py`` and ``writers/arrow_batch.py``); those modules call
in here when the extension was built and fall back to themselves when it was not, and
a property test feeds both the same inputs and asserts the same results.

Nothing here explains an error: every reader raises ``Malformed`` (a ``ValueError``)
on anything unexpected, and the caller runs the reference code on the same bytes,
which names the message type and the byte. So the compiled path can only ever be
faster, never say something different.

* ``bind(unchanged, binary)`` hands over the two marker values tuple data uses
  (``UNCHANGED_TOAST`` and the ``BinaryDatum`` class) once, at import.
* ``insert_parts``, ``update_parts``, ``delete_parts`` read the body of an Insert,
  Update or Delete message from ``pos`` (1, or 5 inside a stream block) to its end and
  return its fields; values are ``bytes`` slices of the message, exactly as the
  reference reader returns them.
* ``text_columns(rows, width)`` turns buffered rows (tuples of ``bytes``/None/
  unchanged) into one Arrow ``binary`` column's buffers per column position: validity
  bitmap, int32 offsets and data, without a Python object per value. It returns
  ``None`` when the rows hold something else (a ``BinaryDatum``) or a column exceeds
  Arrow's 2 GiB ``binary`` limit, and the caller takes the reference path.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_New, PyTuple_SET_ITEM
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from libc.string cimport memcpy, memset


class Malformed(ValueError):
    """The bytes are not what the fast reader expects: ask the reference reader why."""


cdef object _UNCHANGED = None
cdef object _BINARY = None
cdef object _K = "K"
cdef object _O = "O"


def bind(unchanged, binary):
    """Set the unchanged-TOAST marker and the binary-value class (once, at import)."""
    global _UNCHANGED, _BINARY
    _UNCHANGED = unchanged
    _BINARY = binary


cdef inline uint32_t _u32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline Py_ssize_t _u16(const uint8_t* p) noexcept nogil:
    return (<Py_ssize_t>p[0] << 8) | p[1]


cdef tuple _tuple(const uint8_t* p, Py_ssize_t size, Py_ssize_t* at):
    """TupleData at ``at[0]``; moves ``at[0]`` past it. Raises Malformed."""
    cdef Py_ssize_t pos = at[0]
    cdef Py_ssize_t ncols, column, length
    cdef uint8_t kind
    cdef object value
    if pos + 2 > size:
        raise Malformed()
    ncols = _u16(p + pos)
    pos += 2
    cdef tuple values = PyTuple_New(ncols)
    for column in range(ncols):
        if pos >= size:
            raise Malformed()
        kind = p[pos]
        if kind == 116 or kind == 98:  # 't', 'b'
            if pos + 5 > size:
                raise Malformed()
            length = _u32(p + pos + 1)
            pos += 5
            if length > size - pos:
                raise Malformed()
            value = PyBytes_FromStringAndSize(<const char*>(p + pos), length)
            if kind == 98:
                value = _BINARY(value)
            pos += length
        elif kind == 110:  # 'n'
            value = None
            pos += 1
        elif kind == 117:  # 'u'
            value = _UNCHANGED
            pos += 1
        else:
            raise Malformed()
        Py_INCREF(value)
        PyTuple_SET_ITEM(values, column, value)
    at[0] = pos
    return values


def insert_parts(bytes buf, Py_ssize_t pos):
    """``(relation oid, new tuple)`` of an Insert whose oid starts at ``pos``."""
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(buf)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(buf)
    if pos < 0 or pos + 5 > size or p[pos + 4] != 78:  # 'N'
        raise Malformed()
    cdef uint32_t oid = _u32(p + pos)
    pos += 5
    cdef tuple new = _tuple(p, size, &pos)
    if pos != size:
        raise Malformed()
    return oid, new


def update_parts(bytes buf, Py_ssize_t pos):
    """``(oid, old tuple or None, "K"/"O"/None, new tuple)`` of an Update."""
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(buf)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(buf)
    if pos < 0 or pos + 5 > size:
        raise Malformed()
    cdef uint32_t oid = _u32(p + pos)
    cdef uint8_t tag = p[pos + 4]
    pos += 5
    old = None
    old_kind = None
    if tag == 75 or tag == 79:  # 'K', 'O'
        old_kind = _K if tag == 75 else _O
        old = _tuple(p, size, &pos)
        if pos >= size:
            raise Malformed()
        tag = p[pos]
        pos += 1
    if tag != 78:  # 'N'
        raise Malformed()
    cdef tuple new = _tuple(p, size, &pos)
    if pos != size:
        raise Malformed()
    return oid, old, old_kind, new


def delete_parts(bytes buf, Py_ssize_t pos):
    """``(oid, old tuple, "K"/"O")`` of a Delete."""
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(buf)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(buf)
    if pos < 0 or pos + 5 > size:
        raise Malformed()
    cdef uint32_t oid = _u32(p + pos)
    cdef uint8_t tag = p[pos + 4]
    if tag != 75 and tag != 79:
        raise Malformed()
    pos += 5
    cdef tuple old = _tuple(p, size, &pos)
    if pos != size:
        raise Malformed()
    return oid, old, (_K if tag == 75 else _O)


def text_columns(list rows, Py_ssize_t width):
    """Per column position ``(validity, offsets, data, null_count)`` as ``bytes``, for
    ``pyarrow.Array.from_buffers(pa.binary(), len(rows), [validity, offsets, data],
    null_count)``; ``validity`` is None when the column has no NULL. A row shorter than
    ``width`` is NULL in its missing columns; unchanged-TOAST markers are NULL.
    Returns None (use the reference path) for any other value or a column over 2 GiB."""
    cdef Py_ssize_t n = len(rows)
    cdef Py_ssize_t r, c, k, length
    cdef PyObject* row
    cdef PyObject* value
    cdef object bytes_type = bytes
    cdef int64_t* totals = <int64_t*>PyMem_Malloc(max(width, 1) * sizeof(int64_t))
    cdef Py_ssize_t* nulls = <Py_ssize_t*>PyMem_Malloc(max(width, 1) * sizeof(Py_ssize_t))
    cdef list columns = []
    if totals == NULL or nulls == NULL:
        PyMem_Free(totals)
        PyMem_Free(nulls)
        raise MemoryError()
    try:
        memset(totals, 0, width * sizeof(int64_t))
        memset(nulls, 0, width * sizeof(Py_ssize_t))
        # pass 1: sizes and NULL counts, and every value checked
        for r in range(n):
            row = <PyObject*>rows[r]
            if type(<object>row) is not tuple:
                return None
            k = PyTuple_GET_SIZE(<object>row)
            if k > width:
                return None
            for c in range(k):
                value = PyTuple_GET_ITEM(<object>row, c)
                if type(<object>value) is bytes_type:
                    totals[c] += PyBytes_GET_SIZE(<object>value)
                elif <object>value is None or <object>value is _UNCHANGED:
                    nulls[c] += 1
                else:
                    return None
            for c in range(k, width):
                nulls[c] += 1
        for c in range(width):
            if totals[c] > 2147483647:
                return None
        for c in range(width):
            columns.append(_column(rows, n, c, totals[c], nulls[c]))
        return columns
    finally:
        PyMem_Free(totals)
        PyMem_Free(nulls)


cdef tuple _column(list rows, Py_ssize_t n, Py_ssize_t c, int64_t total, Py_ssize_t null_count):
    cdef bytes data = PyBytes_FromStringAndSize(NULL, total)
    cdef bytes offsets = PyBytes_FromStringAndSize(NULL, (n + 1) * sizeof(int32_t))
    cdef object validity = None
    cdef uint8_t* bits = NULL
    cdef char* out = PyBytes_AS_STRING(data)
    cdef int32_t* offs = <int32_t*>PyBytes_AS_STRING(offsets)
    cdef int32_t at = 0
    cdef Py_ssize_t r, length
    cdef PyObject* row
    cdef PyObject* value
    if null_count:
        validity = PyBytes_FromStringAndSize(NULL, (n + 7) // 8)
        bits = <uint8_t*>PyBytes_AS_STRING(validity)
        memset(bits, 0, (n + 7) // 8)
    for r in range(n):
        offs[r] = at
        row = <PyObject*>rows[r]
        if c < PyTuple_GET_SIZE(<object>row):
            value = PyTuple_GET_ITEM(<object>row, c)
            if type(<object>value) is bytes:
                length = PyBytes_GET_SIZE(<object>value)
                memcpy(out + at, PyBytes_AS_STRING(<object>value), length)
                at += <int32_t>length
                if bits != NULL:
                    bits[r >> 3] |= <uint8_t>(1 << (r & 7))
    offs[n] = at
    return validity, offsets, data, null_count
