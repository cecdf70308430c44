"""The exceptions of the sluice package.

Every failure reported by libsluice becomes a SluiceError (or one of its
subclasses) that carries the C library's message (sl_client_errmsg() or
sl_iterator_errmsg()), the negative code and its name."""
import errno
import re

from . import _lib

# The tail _text() gives every message: " [SL_ESPEC: invalid dataset spec]".
_TAIL = re.compile(r'\[([A-Z][A-Z0-9_]*): [^\]]*\]')


def _code_in(text):
    """The code named by the last " [NAME: description]" in text, or
    SL_EINTERNAL. A DataLoader worker's exception comes to the main process
    as its class called with one string (torch's ExceptionWrapper.reraise():
    the worker's traceback, which ends with the original's text), so the
    code is read back from there."""
    by_name = {v: k for k, v in _lib.CODE_NAMES.items()}
    for name in reversed(_TAIL.findall(text or '')):
        if name in by_name:
            return by_name[name]
        if hasattr(errno, name):
            return -getattr(errno, name)
    return _lib.SL_EINTERNAL


class SluiceError(Exception):
    """A failure reported by libsluice.

    Attributes: code (negative: -errno or an SL_E* code of sluice.h),
    code_name ('SL_ESPEC', 'ECONNREFUSED'), description (sl_strerror(code)),
    message (the C library's message naming the peer and the cause)."""

    def __init__(self, message, code=None, context=None):
        if code is None:
            code = _code_in(message)
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
        tail = '[%s: %s]' % (self.code_name, self.description)
        if self.message.rstrip().endswith(tail):  # a text that says it already (from a DataLoader worker)
            return head + self.message
        return '%s%s %s' % (head, self.message, tail)

    def __str__(self):
        return self._text()


class SluiceWaitWarning(UserWarning):
    """An iterator waits on something that may never come (e.g. no live
    worker serves its job); the text says what, and which option bounds
    the wait. libsluice says the same on stderr."""


class SluiceUsageWarning(UserWarning):
    """A use that works but likely not as meant: a DataLoader that batches
    the Sluice batches again, DataLoader processes that each read the whole
    dataset under sharding "off"."""


class SpecError(SluiceError, ValueError):
    """The dispatcher refused the dataset spec (SL_ESPEC); the message starts
    with the JSON path of the offending field, e.g. '$.ops[0].batch_size'."""


class SluiceFileNotFoundError(SluiceError, FileNotFoundError):
    """A file source's pattern matches no file the dispatcher may read
    (-ENOENT); the message starts with its JSON path, '$.source.files[0]'."""


class SluicePermissionError(SluiceError, PermissionError):
    """A file source given to a dispatcher without --data-root, or a file it
    may not read (-EACCES, -EPERM); the message names the JSON path."""


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
               -errno.EPIPE, -errno.ECONNABORTED, _lib.SL_ECLOSED, _lib.SL_ENOHOST}

_BY_CODE = {
    _lib.SL_ESPEC: SpecError,
    _lib.SL_EINVAL: InvalidArgumentError,
    -errno.ETIMEDOUT: SluiceTimeoutError,
    _lib.SL_ECANCELLED: JobCancelledError,
    _lib.SL_EDATA: DataError,
    _lib.SL_ECONFLICT: ConflictError,
    _lib.SL_ENOTFOUND: NotFoundError,
    -errno.ENOENT: SluiceFileNotFoundError,
    -errno.EACCES: SluicePermissionError,
    -errno.EPERM: SluicePermissionError,
}


def from_code(code, message, context=None):
    """The exception for a negative code from libsluice."""
    cls = _BY_CODE.get(code)
    if cls is None:
        cls = SluiceConnectionError if code in _CONNECTION else SluiceError
    return cls(message, code, context)
