# Types of router/affinity.py when compiled (Cython's pure Python mode): the .py is the code.

cimport cython

cpdef object stable_key(bytes data)
@cython.locals(fields=dict)
cpdef object affinity_key(object payload, dict headers, str mode, Py_ssize_t prefix_chars)
cpdef str prompt_prefix(dict payload, Py_ssize_t chars)
