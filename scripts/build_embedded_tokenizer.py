#!/usr/bin/env python
"""Rebuild sa_lightning/data/embedded/tokenizer.json from the embedded corpus's train split.

    python scripts/build_embedded_tokenizer.py
"""
from sa_lightning.data.corpus import embedded_documents
from sa_lightning.data.tokenizer import EMBEDDED_FILE, train_embedded_tokenizer

if __name__ == "__main__":
    tok = train_embedded_tokenizer(embedded_documents("train"))
    tok.save(str(EMBEDDED_FILE))
    print(f"wrote {EMBEDDED_FILE} (vocab {tok.get_vocab_size()})")
