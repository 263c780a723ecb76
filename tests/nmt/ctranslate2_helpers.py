"""The tiny fixture's CTranslate2 exports and an engine on them, shared by test_ctranslate2_export.py and
test_ctranslate2_engine.py (tests/nmt/conftest.py wraps `export_float32_and_int8` in a module-scoped fixture)."""

from nmt.ctranslate2_engine import CTranslate2Translator
from nmt.ctranslate2_export import export_ctranslate2


def export_float32_and_int8(ours, root):
    """The model of the Translator `ours` exported in float32 and int8, as `root`/float32 and `root`/int8."""
    kwargs = dict(eval_config=ours.config.eval, data_config=ours.config.data, weights=ours.weights)
    return {
        q: export_ctranslate2(ours.model, ours.tokenizer, root / q, quantization=q, **kwargs)
        for q in ("float32", "int8")
    }


def engine(export, tokenizer, eval_config, **kwargs):
    """The CTranslate2 engine on `export`, one thread per translation."""
    return CTranslate2Translator(export, tokenizer, eval_config, intra_threads=1, **kwargs)
