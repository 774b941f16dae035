# Types of router/path/sender.py when compiled (Cython's pure Python mode): the .py is the code.

cimport cython

from router.protocol._wire cimport send_now


cdef class Sender:
    cdef public object transport
    cdef public bint spilled
    cdef public int fd

    @cython.locals(sent=Py_ssize_t)
    cpdef void write(self, bytes data) except *
