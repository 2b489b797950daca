"""Errors and warnings raised by the format readers."""
from __future__ import annotations


class DataError(ValueError):
    """Bad input data (not a bug in the caller).

    ``str()`` names the file, the shard id, the sample index and the 1-based line number when they
    are known, then the reason, e.g.::

        /data/a.jsonl (shard 3, sample 17, line 18): invalid JSON: Expecting ',' delimiter (column 9)

    Attributes ``path``, ``shard``, ``sample``, ``line`` (each ``None`` when unknown) and ``reason``
    (the bare message) stay available for callers that count or report errors.
    """

    def __init__(self, message: str, *, path: str | None = None, shard: int | None = None,
                 sample: int | None = None, line: int | None = None):
        self.reason = message
        self.path = path
        self.shard = shard
        self.sample = sample
        self.line = line
        super().__init__(self._format())

    def _format(self) -> str:
        where = [f"{k} {v}" for k, v in (("shard", self.shard), ("sample", self.sample), ("line", self.line))
                 if v is not None]
        head = self.path or ""
        if where:
            head = f"{head} ({', '.join(where)})" if head else f"({', '.join(where)})"
        return f"{head}: {self.reason}" if head else self.reason

    def __str__(self) -> str:
        return self._format()

    def __reduce__(self):
        # Keyword-only arguments are lost by the default exception pickling; errors cross process
        # boundaries in the process runner, so rebuild from all fields.
        return (_rebuild, (self.reason, self.path, self.shard, self.sample, self.line, type(self)))

    def located(self, *, path: str | None = None, shard: int | None = None,
                sample: int | None = None, line: int | None = None) -> "DataError":
        """A copy with the missing location fields filled in (known fields are kept)."""
        return DataError(self.reason, path=self.path if self.path is not None else path,
                         shard=self.shard if self.shard is not None else shard,
                         sample=self.sample if self.sample is not None else sample,
                         line=self.line if self.line is not None else line)


def per_sample(indices, read_one, on_error: str) -> list:
    """``[read_one(int(i)) for i in indices]``, except that a DataError from one sample becomes
    ``{"__error__": str(error)}`` in its place when on_error="skip" (with "raise" it propagates)."""
    out = []
    for i in indices:
        try:
            out.append(read_one(int(i)))
        except DataError as e:
            if on_error != "skip":
                raise
            out.append({"__error__": str(e)})
    return out


def _rebuild(reason, path, shard, sample, line, cls=DataError):
    return cls(reason, path=path, shard=shard, sample=sample, line=line)


class DamagedIndexError(DataError):
    """A dataset's own index or metadata file (MDS ``index.json``, Energon ``.nv-meta``) is there but damaged:
    not readable as what it should be. The format is known from its presence; nothing is guessed around it."""


_UNSAFE_HINT = "; pass allow_unsafe_types=True to {} if you trust this data"


class UnsafeDataError(DataError):
    """Data whose decoding runs arbitrary code (an MDS ``pkl`` column), refused without ``allow_unsafe_types``. Its
    reason ends with where to pass that keyword: ``open_dataset``, or a host's own class (``opened_by``)."""

    @classmethod
    def refuse(cls, what: str, *, path: str, shard: int | None = None,
               opener: str = "open_dataset") -> UnsafeDataError:
        """The error for ``what`` (e.g. "column 'meta' uses the unsafe encoding 'pkl' (...)"), naming ``path``
        and ``shard``, telling the user to pass ``allow_unsafe_types=True`` to ``opener``."""
        return cls(what + _UNSAFE_HINT.format(opener), path=path, shard=shard)

    def opened_by(self, opener: str) -> UnsafeDataError:
        """This error telling the user to pass ``allow_unsafe_types=True`` to ``opener`` (a host adapter's class,
        e.g. "StreamingDataset", which takes that keyword itself) instead of ``open_dataset``."""
        what = self.reason.removesuffix(_UNSAFE_HINT.format("open_dataset"))
        return type(self).refuse(what, path=self.path, shard=self.shard, opener=opener)


class DataWarning(UserWarning):
    """Bad input that was skipped because the caller asked for ``on_error="skip"`` (e.g. an empty file)."""
