"""Special token ids (defined in `common.special_ids`, re-exported here for the model and its users)."""

from common.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID

__all__ = ["BOS_ID", "EOS_ID", "PAD_ID", "UNK_ID"]
