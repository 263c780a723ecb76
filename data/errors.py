"""The one exception type of the `data` package."""


class DataError(ValueError):
    """A data problem a person must fix (missing or malformed file, unknown dataset or language, no network).

    The message names the file, dataset or config key at fault and says what to do.
    """
