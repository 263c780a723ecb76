import hashlib
import os
import sys

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
sys.path.insert(0, "tests/nmt")
sys.path.insert(0, ".")
import keras

from nmt.precision import set_policy

set_policy("mixed_bfloat16")
from test_train_step import batch, make_step, tiny_model  # noqa: E402 (after the policy, as the tests import it)

keras.utils.set_random_seed(0)
model = tiny_model(dropout=0.1, num_layers=3, d_model=256, d_ff=1024, num_heads=4)
step = make_step(model)
b = batch(1, batch_size=int(sys.argv[1]), length=int(sys.argv[2]))
if sys.argv[3] == "relax":
    step._relax(step.gradients, b)
grads, sums = step.gradients(b)
print("loss", sums.numpy().tolist())
h = hashlib.md5()
for g in grads:
    h.update(g.numpy().tobytes())
print("grads", h.hexdigest()[:10])
