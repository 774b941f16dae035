# Types of router/path/affinity.py when compiled (Cython's pure Python mode): the .py is the code.

cimport cython

from router.protocol._bodyscan cimport BodyFields

cpdef object stable_key(bytes data)
@cython.locals(fields=dict, scanned=BodyFields, key="long long")
cpdef object affinity_key(object payload, bytes session_id, str mode, Py_ssize_t prefix_chars)
cpdef str prompt_prefix(dict payload, Py_ssize_t chars)
cpdef str _part_text(object part)
