"""The tiny config of train-exit.sh: `python train-exit-config.py STEPS` (from /work/main) writes
/work/scratch/exitstall/tiny.yaml, a tiny run of STEPS steps with no evaluation and no periodic checkpoint."""

import sys
from pathlib import Path

import yaml

sys.path.insert(0, "/work/main")
from tests.run_fixture import tiny_config_tree, write_corpus  # noqa: E402

root = Path("/work/scratch/exitstall")
tree = tiny_config_tree(write_corpus(root / "corpus"))
tree["data"]["cache_dir"] = str(root / "cache")
tree["train"].update(
    max_steps=int(sys.argv[1]), eval_every=0, bleu_every=0, checkpoint_every=100000, log_every=100
)
(root / "tiny.yaml").write_text(yaml.safe_dump(tree))
