# Types of router/target.py when compiled (Cython's pure Python mode): the .py is the code.

cimport cython

from router cimport _wire
from router._bodyscan cimport BodyFields, scan_body


@cython.locals(payload=dict, content_type=bytes, fields=BodyFields, method=bytes, body=bytes)
cpdef tuple target_of(_wire.Request request)
