"""The one exception type of the `data` package."""


class DataError(ValueError):
    """A data problem a person must fix (missing or malformed file, unknown dataset or language, no network).

    The message names the file, dataset or config key at fault and says what to do.
    """


def raised_in_pipeline(err: BaseException) -> str | None:
    """The message of a DataError raised inside a tf.data function (a batch read from a damaged file), which
    TensorFlow hands on as an OpError whose text holds "DataError: <message>"; None for any other error."""
    text = getattr(err, "message", None)
    if not isinstance(text, str) or "DataError: " not in text:
        return None
    return text.split("DataError: ", 1)[1].split("\n", 1)[0].strip()
