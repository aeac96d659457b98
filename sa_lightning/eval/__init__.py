"""Zero-shot evaluation: the lm-eval model, the offline tasks and the Table 1 layout.

The Lightning callbacks that run it during ``fit`` and ``test`` live in ``sa_lightning.lit``
(``ZeroShotEval``, ``AttentionMapLogger``).
"""
