"""The exceptions of the sluice package.

Every failure reported by libsluice becomes a SluiceError (or one of its
subclasses) that carries the C library's message (sl_client_errmsg() or
sl_iterator_errmsg()), the negative code and its name."""
import errno

from . import _lib


class SluiceError(Exception):
    """A failure reported by libsluice.

    Attributes: code (negative: -errno or an SL_E* code of sluice.h),
    code_name ('SL_ESPEC', 'ECONNREFUSED'), description (sl_strerror(code)),
    message (the C library's message naming the peer and the cause)."""

    def __init__(self, message, code=_lib.SL_EINTERNAL, context=None):
        self.code = code
        self.code_name = _lib.code_name(code)
        self.description = _lib.strerror(code)
        self.message = message or self.description
        self.context = context
        super().__init__(self._text())
        if isinstance(self, OSError) and -4096 < code < 0:
            self.errno = -code
            self.strerror = self.description

    def __reduce__(self):
        return (self.__class__, (self.message, self.code, self.context))

    def _text(self):
        head = '%s: ' % self.context if self.context else ''
        return '%s%s [%s: %s]' % (head, self.message, self.code_name, self.description)

    def __str__(self):
        return self._text()


class SluiceWaitWarning(UserWarning):
    """An iterator waits on something that may never come (e.g. no live
    worker serves its job); the text says what, and which option bounds
    the wait. libsluice says the same on stderr."""


class SpecError(SluiceError, ValueError):
    """The dispatcher refused the dataset spec (SL_ESPEC); the message starts
    with the JSON path of the offending field, e.g. '$.ops[0].batch_size'."""


class InvalidArgumentError(SluiceError, ValueError):
    """An option out of its range (SL_EINVAL)."""


class SluiceTimeoutError(SluiceError, TimeoutError):
    """A peer did not answer within the timeout (-ETIMEDOUT)."""


class SluiceConnectionError(SluiceError, ConnectionError):
    """A peer could not be reached or closed the connection."""


class JobCancelledError(SluiceError):
    """The job was cancelled or collected (SL_ECANCELLED)."""


class DataError(SluiceError):
    """A worker's pipeline failed on its data (SL_EDATA)."""


class ConflictError(SluiceError):
    """A named job exists with other parameters (SL_ECONFLICT)."""


class NotFoundError(SluiceError):
    """No such dataset, job, task or worker (SL_ENOTFOUND)."""


_CONNECTION = {-errno.ECONNREFUSED, -errno.ECONNRESET, -errno.EHOSTUNREACH, -errno.ENETUNREACH,
               -errno.EPIPE, -errno.ECONNABORTED, _lib.SL_ECLOSED}

_BY_CODE = {
    _lib.SL_ESPEC: SpecError,
    _lib.SL_EINVAL: InvalidArgumentError,
    -errno.ETIMEDOUT: SluiceTimeoutError,
    _lib.SL_ECANCELLED: JobCancelledError,
    _lib.SL_EDATA: DataError,
    _lib.SL_ECONFLICT: ConflictError,
    _lib.SL_ENOTFOUND: NotFoundError,
}


def from_code(code, message, context=None):
    """The exception for a negative code from libsluice."""
    cls = _BY_CODE.get(code)
    if cls is None:
        cls = SluiceConnectionError if code in _CONNECTION else SluiceError
    return cls(message, code, context)
