# Types of router/protocol/sink.py when compiled (Cython's pure Python mode): the .py is the code.


cdef class AnswerSink:
    cpdef void answer_head(self, int status) except *
    cpdef void answer_body(self, bytes data) except *
    cpdef void answer_complete(self, bint keep_alive) except *
