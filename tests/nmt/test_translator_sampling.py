"""Translator with sampling: a line's sample depends on the seed and its line number only (not the batching, the
streams, XLA, the chunks of a stream or the other lines), and a beam is refused."""

import dataclasses

import pytest

from data.tokenizer import Tokenizer
from nmt.translator import Translator
from tests.run_fixture import shared_tiny_run_dir, tiny_corpus
from transformer.sampling import Sampling


@pytest.fixture(scope="module")
def translator(tmp_path_factory, request):
    run_dir = shared_tiny_run_dir(tmp_path_factory, getattr(request.config, "cache", None))
    translator = Translator.from_run_dir(run_dir)
    translator.tokenizer = Tokenizer.load(run_dir / "tokenizer")
    return translator


def lines(n=10):
    return [source for source, _ in tiny_corpus()["test"][:n]]


def test_a_lines_sample_depends_on_the_seed_and_its_number_only(translator):
    # Whole vocabulary, hot: the fixture memorised its corpus, so greedy-like settings would hide the draws.
    sampling = Sampling(temperature=3.0, seed=5)
    text = lines() + [""]
    translator.batch_size, translator.streams = 16, 1
    together = translator.translate(text, sampling=sampling)
    assert together[-1] == "" and all(together[:-1])
    translator.batch_size, translator.streams = 3, 2
    assert translator.translate(text, sampling=sampling) == together
    assert list(translator.translate_stream(text, chunk_size=4, sampling=sampling)) == together
    # Line 7 alone, numbered 7, samples as it did among the others.
    assert translator.translate(text[7:8], sampling=sampling, first_line=7) == together[7:8]
    xla = Translator(
        translator.model,
        translator.tokenizer,
        translator.eval_config,
        max_source_length=translator.max_source_length,
        xla=True,
    )
    assert xla.translate(text, sampling=sampling) == together
    greedy = translator.translate(text, beam_size=1)
    traces = translator.num_traces
    other_seed = translator.translate(text, sampling=Sampling(temperature=3.0, seed=6))
    assert other_seed != together and together != greedy
    assert translator.num_traces == traces  # the seed is an argument of the traced function
    assert translator.translate(text, sampling=sampling) == together  # reproducible


def test_sampling_refuses_a_beam(translator):
    with pytest.raises(ValueError, match="beam_size must be 1"):
        translator.translate(["a"], beam_size=4, sampling=Sampling())


def test_an_ensemble_of_the_model_with_itself_samples_as_the_model(translator):
    """The ensemble's mean of two equal distributions is the distribution: the same draws (a number would have to
    fall within the mean's rounding, about 1e-7, of a boundary between two tokens to draw otherwise)."""
    from transformer.ensemble import Ensemble

    sampling = Sampling(topk=5, temperature=2.0, seed=9)
    text = lines()
    ensemble = Translator(
        Ensemble([translator.model, translator.model]),
        translator.tokenizer,
        translator.eval_config,
        max_source_length=translator.max_source_length,
        xla=False,
    )
    alone = translator.translate(text, sampling=sampling)
    assert ensemble.translate(text, sampling=sampling) == alone
    assert alone != translator.translate(text, sampling=dataclasses.replace(sampling, seed=10))
