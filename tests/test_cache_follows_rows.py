"""The derived-cost cache follows every row: its key covers every row's cost inputs, not a
sample of the rows, so a text edited in a row no sample would have read is probed again.

A real Bridge MegatronMIMODataset of 5,000 rows (a real tokenizer, a real Qwen2-VL image
processor, real image files on a few rows).
"""

from __future__ import annotations

import numpy as np

from mimo_accel.datasets import derive_cost_index
from tests.test_derive import mimo_dataset, qwen_processor, write_image

N = 5000
SAMPLED = set(np.linspace(0, N - 1, 4096).round().astype(int).tolist())  # the rows the old key hashed


def _examples(root):
    root.mkdir()
    images = [str(write_image(root / f"{i}.png", 56, 28 * (i + 1))) for i in range(4)]
    # three words: four tokens with the BOS the tokenizer prepends
    return [{"image": images[i % 4] if i % 50 == 0 else None, "text": "describe the cat"} for i in range(N)]


def test_a_text_grown_in_an_unsampled_row_misses_the_cache(tmp_path):
    examples = _examples(tmp_path / "img")
    row = next(i for i in range(N) if i not in SAMPLED and i % 50)
    cache = tmp_path / "cache"
    before = derive_cost_index(mimo_dataset(examples, qwen_processor(), seq_length=1024), cache_dir=cache)
    assert int(before.tokens(np.array([row]))[0]) == 4
    examples[row] = {**examples[row], "text": "the " * 800}  # 801 tokens
    ds = mimo_dataset(examples, qwen_processor(), seq_length=1024)
    after = derive_cost_index(ds, cache_dir=cache)
    assert int(after.tokens(np.array([row]))[0]) == 801 == ds._tokenize_with_placeholders(examples[row]["text"], {})[1]
    assert not after.mapped and len(list(cache.glob("*.npz"))) == 2  # probed, not read from the cache
    every = np.arange(N)
    assert np.flatnonzero(after.tokens(every) != before.tokens(every)).tolist() == [row]
    # the edit undone: the first cache is found again
    examples[row] = {**examples[row], "text": "describe the cat"}
    again = derive_cost_index(mimo_dataset(examples, qwen_processor(), seq_length=1024), cache_dir=cache)
    assert again.mapped and again.digest() == before.digest()
