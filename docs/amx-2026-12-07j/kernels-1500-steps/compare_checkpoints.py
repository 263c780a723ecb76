import sys

import numpy as np
import tensorflow as tf

a, b = (tf.train.load_checkpoint(tf.train.latest_checkpoint(p)) for p in sys.argv[1:3])
m = a.get_variable_to_dtype_map()
names = sorted(n for n in m if m[n] != tf.variant and m[n] != tf.string)
diff = [n for n in names if not np.array_equal(a.get_tensor(n), b.get_tensor(n))]
print(len(names), "tensors,", len(diff), "differ")
print("\n".join(diff[:20]))
