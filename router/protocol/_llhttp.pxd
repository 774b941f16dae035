# llhttp's C interface, as the extensions built on it read it (router/protocol/_wire.pyx,
# router/load/_loadread.pyx); each of them carries llhttp's code (setup.py).

cdef extern from "llhttp.h":
    ctypedef struct llhttp_t:
        void* data
        unsigned char method
        unsigned char upgrade
        unsigned char http_major
        unsigned char http_minor
        unsigned short status_code

    ctypedef int (*llhttp_data_cb)(llhttp_t*, const char*, size_t) noexcept
    ctypedef int (*llhttp_cb)(llhttp_t*) noexcept

    ctypedef struct llhttp_settings_t:
        llhttp_cb on_message_begin
        llhttp_data_cb on_url
        llhttp_data_cb on_status
        llhttp_data_cb on_header_field
        llhttp_data_cb on_header_value
        llhttp_cb on_header_value_complete
        llhttp_cb on_headers_complete
        llhttp_data_cb on_body
        llhttp_cb on_message_complete

    ctypedef enum llhttp_errno_t:
        HPE_OK
        HPE_PAUSED_UPGRADE

    ctypedef enum llhttp_type_t:
        HTTP_REQUEST
        HTTP_RESPONSE

    ctypedef enum llhttp_method_t:
        pass

    void llhttp_settings_init(llhttp_settings_t* settings)
    void llhttp_init(llhttp_t* parser, llhttp_type_t kind, const llhttp_settings_t* settings)
    llhttp_errno_t llhttp_execute(llhttp_t* parser, const char* data, size_t size)
    int llhttp_should_keep_alive(const llhttp_t* parser)
    const char* llhttp_method_name(llhttp_method_t method)
    const char* llhttp_get_error_reason(const llhttp_t* parser)
    llhttp_errno_t llhttp_finish(llhttp_t* parser)
    void llhttp_reset(llhttp_t* parser)
