"""Special token ids, defined once for the whole project.

The SentencePiece models trained by `data.tokenizer` reserve exactly these ids, and the model and the decoders use
them for padding masks and for starting and stopping a translation. `transformer.vocab` re-exports them.
"""

PAD_ID = 0  # padding; never attended to, never in the loss
UNK_ID = 1  # unknown piece
BOS_ID = 2  # start of a target sentence (decoder input only)
EOS_ID = 3  # end of a sentence (source and target)
