import sys, yaml
sys.path.insert(0, "/work/main")
from pathlib import Path
from tests.run_fixture import tiny_config_tree, write_corpus
root = Path("/work/scratch/exitstall")
tree = tiny_config_tree(write_corpus(root / "corpus"))
tree["data"]["cache_dir"] = str(root / "cache")
tree["train"].update(max_steps=int(sys.argv[1]), eval_every=0, bleu_every=0, checkpoint_every=100000, log_every=100)
(root / "tiny.yaml").write_text(yaml.safe_dump(tree))
