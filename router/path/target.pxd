# Types of router/path/target.py when compiled (Cython's pure Python mode): the .py is the code.

cimport cython

from router.protocol cimport _wire
from router.protocol._bodyscan cimport BodyFields, scan_body


@cython.locals(payload=dict, content_type=bytes, fields=BodyFields, method=bytes, body=bytes)
cpdef tuple target_of(_wire.Request request)
