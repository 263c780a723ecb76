"""The base config's model in OpenNMT-tf: 3+3 layers, d_model 256, 4 heads, d_ff 1024, dropout 0.1, Post-LN, all
embeddings shared (tied output)."""

import opennmt


def model():
    return opennmt.models.Transformer(
        source_inputter=opennmt.inputters.WordEmbedder(embedding_size=256),
        target_inputter=opennmt.inputters.WordEmbedder(embedding_size=256),
        num_layers=3,
        num_units=256,
        num_heads=4,
        ffn_inner_dim=1024,
        dropout=0.1,
        attention_dropout=0.0,
        ffn_dropout=0.1,
        pre_norm=False,
        share_embeddings=opennmt.models.EmbeddingsSharingLevel.ALL,
    )
