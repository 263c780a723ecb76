"""Multi30k en->de as SentencePiece pieces (the base config's 8k joint model) for OpenNMT-tf, and its vocabulary."""

# Run as used: the base config's SentencePiece model (the one runs/main-2026-12-07g-amx/tokenizer holds, the same file as
# the prepared cache's for configs/base.yaml), the mirrored Multi30k; writes the pieces and vocab.txt here.
import gzip

import sentencepiece as spm

sp = spm.SentencePieceProcessor(model_file="/work/main/runs/main-2026-12-07g-amx/tokenizer/spm.model")
for split in ("train", "val"):
    for lang in ("en", "de"):
        with (
            gzip.open(f"/work/shared/data/multi30k/{split}.{lang}.gz", "rt", encoding="utf-8") as f,
            open(f"{split}.{lang}.sp", "w") as out,
        ):
            for line in f:
                out.write(" ".join(sp.encode(line.strip(), out_type=str)) + "\n")
with open("vocab.txt", "w") as out:
    for i in range(sp.get_piece_size()):
        if not (sp.is_control(i) or sp.is_unknown(i)):
            out.write(sp.id_to_piece(i) + "\n")
print(sp.get_piece_size())
