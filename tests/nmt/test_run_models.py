"""nmt.run_models: an ensemble of run directories through `Translator.from_run_dir(ensemble=...)`, against NumPy;
what it refuses."""

import numpy as np
import pytest
import tensorflow as tf

from nmt.translator import Translator, output_limits
from tests.run_fixture import salads, tiny_corpus
from transformer.vocab import BOS_ID, EOS_ID, PAD_ID


def sources(n):
    return [s for s, _ in tiny_corpus()["test"][:n]]


def perturbed_copy(run_dir, copy, seed=7, scale=0.05):
    """A copy of a run directory whose final weights are the run's plus Gaussian noise: a second model with the
    same tokenizer."""
    import shutil

    from nmt.checkpoints import checkpoint_step, save_model_weights

    shutil.copytree(run_dir, copy)
    model = Translator.from_run_dir(copy).model
    rng = np.random.default_rng(seed)
    for variable in model.trainable_variables:
        variable.assign_add(rng.normal(0, scale, variable.shape).astype(np.float32))
    step = checkpoint_step(tf.train.latest_checkpoint(str(copy / "final")))
    shutil.rmtree(copy / "final")
    save_model_weights(model, copy / "final", step)
    return copy


def test_an_ensemble_of_runs_follows_the_mean_of_their_probabilities(tiny_run_dir, tmp_path):
    """Greedy translations of two runs' ensemble against a NumPy loop that averages the two models' probabilities
    from full forward passes over the prefix. On the word salads (sentences the runs never saw) the mean's choice
    differs somewhere from each run's own: an ensemble that decoded with one run alone would not give the mean's
    translations (on the memorised test lines the two runs agree)."""
    other = perturbed_copy(tiny_run_dir, tmp_path / "other")
    ensemble = Translator.from_run_dir(tiny_run_dir, ensemble=[other])
    assert " + " in ensemble.weights and len(ensemble.model) == 2
    models = [Translator.from_run_dir(path).model for path in (tiny_run_dir, other)]

    # a full forward pass of each model over the prefix, traced once for every length (eager: ~0.1 s per call)
    @tf.function(input_signature=[tf.TensorSpec([1, None], tf.int32)] * 2, autograph=False)
    def last_logits(source, target_in):
        return tf.stack([m({"source": source, "target_in": target_in})[0, -1] for m in models])

    tokenizer = ensemble.tokenizer
    lines = sources(2) + salads(8, seed=3)
    got = ensemble.translate(lines, beam_size=1)
    overruled = [False, False]  # a step where the mean's choice is not the run's own choice
    for line, translation in zip(lines, got):
        pieces = ensemble.encode([line])[0]
        source = tf.constant([[*pieces, EOS_ID]], tf.int32)
        cfg = ensemble.eval_config
        limit = output_limits(len(pieces), cfg.max_length_a, cfg.max_length_b, ensemble.max_target_length)
        prefix = [BOS_ID]
        while len(prefix) <= limit and prefix[-1] != EOS_ID:  # EOS forced after `limit` pieces
            logits = last_logits(source, tf.constant([prefix], tf.int32)).numpy().astype(np.float64)
            probs = np.mean([np.exp(x - x.max()) / np.exp(x - x.max()).sum() for x in logits], axis=0)
            probs[[PAD_ID, BOS_ID]] = 0
            prefix.append(int(probs.argmax()))
            for run, run_logits in enumerate(logits):
                run_logits[[PAD_ID, BOS_ID]] = -np.inf
                overruled[run] |= int(run_logits.argmax()) != prefix[-1]
        expected = tokenizer.detokenize_target(tf.constant(prefix[1:], tf.int32)).numpy().decode()
        assert translation == expected, line
    assert overruled == [True, True], (
        "the ensemble's greedy choices must differ somewhere from each run's own"
    )


def test_an_ensemble_needs_one_tokenizer(tiny_run_dir, tmp_path):
    import shutil

    from sentencepiece import sentencepiece_model_pb2

    from nmt.run_dir import RunDirError

    other = tmp_path / "other"
    shutil.copytree(tiny_run_dir, other)
    (model_file,) = (other / "tokenizer").glob("*.model")
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model_file.read_bytes())
    proto.pieces[10].score -= 1.0  # another tokenizer, as a run trained on other data would have
    model_file.write_bytes(proto.SerializeToString())
    with pytest.raises(RunDirError, match=f"{other} has another tokenizer than {tiny_run_dir}"):
        Translator.from_run_dir(tiny_run_dir, ensemble=[other])
    from tests.test_cli_evaluate_engines import reversed_run

    reverse = reversed_run(tiny_run_dir, tmp_path / "reverse")
    with pytest.raises(RunDirError, match=f"{reverse} translates de into en, {tiny_run_dir} en into de"):
        Translator.from_run_dir(tiny_run_dir, ensemble=[reverse])


def test_an_ensemble_run_with_a_shorter_position_table_is_refused(tiny_run_dir, tmp_path):
    import shutil

    import yaml

    from nmt.run_dir import RunDirError

    other = tmp_path / "other"
    shutil.copytree(tiny_run_dir, other)
    tree = yaml.safe_load((other / "config.yaml").read_text(encoding="utf-8"))
    data_max = tree["data"]["max_length"]
    tree["model"]["max_length"] = data_max - 1
    tree["data"]["max_length"] = data_max - 1
    (other / "config.yaml").write_text(yaml.safe_dump(tree, sort_keys=False), encoding="utf-8")
    with pytest.raises(RunDirError, match=f"shorter than {tiny_run_dir}'s data.max_length \\({data_max}\\)"):
        Translator.from_run_dir(tiny_run_dir, ensemble=[other])
