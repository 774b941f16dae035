# Types of router/target.py when compiled (Cython's pure Python mode): the .py is the code.

cimport cython

from router._bodyscan cimport BodyFields, scan_body


@cython.locals(payload=dict, content_type=bytes, fields=BodyFields)
cpdef tuple target_of(bytes method, bytes url, dict headers, bytes body)
