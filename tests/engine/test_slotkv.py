"""``SlotKV`` on plain tensors: every key written is its row and position (``row * 1000 + p``),
so where it lands in the buffers, and what a forward reads back, can be checked exactly.

One full-attention layer and one sliding layer with a window of 4.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from wschat.server.engine.local.attention import FULL, SLIDING
from wschat.server.engine.local.sequence_kv import KVState, LayerLayout
from wschat.server.engine.local.slotkv import SlotKV

WINDOW = 4
LAYOUT = LayerLayout((FULL, SLIDING), WINDOW, 1, 1, torch.float32, torch.device("cpu"))
PAD = -1.0


def forward(kv: SlotKV, counts: list[int], first: int = 0) -> dict[str, torch.Tensor]:
    """One planned forward of ``counts[b]`` new tokens for row ``first + b``; the keys each
    layer reads."""
    positions, masks = kv.plan(counts, first)
    rows, width = positions.shape
    real = torch.arange(width)[None, :] < torch.tensor(counts)[:, None]
    marks = (first + torch.arange(rows))[:, None] * 1000 + positions
    keys = torch.where(real, marks.float(), PAD).reshape(rows, 1, width, 1)
    read = {
        kind: kv.update(keys, keys.clone(), layer)[0] for layer, kind in enumerate(kv.layout.kinds)
    }
    kv.advance()
    return {kind: t.flatten(1) for kind, t in read.items()} | {
        f"{k}_mask": m for k, m in masks.items() if m is not None
    }


def ring(kv: SlotKV, row: int) -> list[int]:
    return [int(x) for x in kv.save(row).ring[0][0].flatten()]


def full(kv: SlotKV, row: int) -> list[int]:
    return [int(x) for x in kv.save(row).full[0][0].flatten()]


def test_a_sliding_layer_keeps_position_p_in_ring_column_p_mod_window() -> None:
    kv = SlotKV(LAYOUT, rows=1)
    kv.add()
    forward(kv, [6])  # a prefill longer than the window: only its last 4 enter the ring
    assert ring(kv, 0) == [4, 5, 2, 3]
    forward(kv, [1])  # position 6 overwrites the oldest, position 2
    assert ring(kv, 0) == [4, 5, 6, 3]
    assert full(kv, 0) == list(range(7))
    assert kv.lengths == [7]


def test_a_decode_step_reads_the_whole_ring_and_every_full_column_so_far() -> None:
    kv = SlotKV(LAYOUT, rows=1)
    kv.add()
    forward(kv, [9])
    read = forward(kv, [1])
    assert read[SLIDING][0].tolist() == [8, 9, 6, 7]  # the last 4 positions, 9 just written
    assert read[FULL][0].tolist() == list(range(10))
    assert read[f"{FULL}_mask"][0, 0, 0].tolist() == [True] * 10


def test_a_short_row_beside_a_long_one_sees_only_ring_columns_it_wrote() -> None:
    kv = SlotKV(LAYOUT, rows=2)
    kv.add()
    kv.add()
    forward(kv, [9, 2])  # row 1 is padded with 7 tokens that must not reach its ring
    assert ring(kv, 1) == [1000, 1001]
    read = forward(kv, [1, 1])
    mask = read[f"{SLIDING}_mask"][:, 0, 0]
    assert mask.tolist() == [[True] * 4, [True, True, True, False]]  # column 3: never written
    assert read[SLIDING][1, :3].tolist() == [1000, 1001, 1002]
    # the full layer: row 1 reads its 3 positions, nothing of row 0's length
    assert read[f"{FULL}_mask"][1, 0, 0].tolist() == [True] * 3 + [False] * 7


def test_padded_queries_of_a_wide_forward_see_only_their_rows_real_tokens() -> None:
    kv = SlotKV(LAYOUT, rows=2)
    kv.add()
    kv.add()
    read = forward(kv, [3, 1])
    mask = read[f"{SLIDING}_mask"][1, 0]  # [queries, keys]: the ring is empty, the new tokens
    # the real token sees itself; a pad sees the real token and itself: never an empty softmax
    assert mask.tolist() == [[True, False, False], [True, True, False], [True, False, True]]
    # the row of 3 real tokens: causal
    assert read[f"{SLIDING}_mask"][0, 0].tolist() == [
        [True, False, False],
        [True, True, False],
        [True, True, True],
    ]
    assert read[SLIDING][1].tolist() == [1000, PAD, PAD]


def test_full_buffers_grow_by_doubling_and_keep_what_they_held() -> None:
    kv = SlotKV(LAYOUT, rows=2, capacity=4)
    kv.add()
    kv.add()
    forward(kv, [3, 2])
    assert kv.capacity == 4
    forward(kv, [3, 1])  # row 0 reaches 6 columns
    assert kv.capacity == 8
    assert full(kv, 0) == list(range(6)) and full(kv, 1) == [1000, 1001, 1002]
    kv.load(1, KVState(20, [(torch.zeros(1, 20, 1),) * 2], [(torch.zeros(1, 4, 1),) * 2], 16))
    assert kv.capacity == 20  # more than double: exactly what is needed
    assert full(kv, 0) == list(range(6))


def test_buffers_that_run_out_of_memory_growing_keep_one_width_and_the_rows_states() -> None:
    two_full = LayerLayout((FULL, FULL, SLIDING), WINDOW, 1, 1, torch.float32, torch.device("cpu"))
    kv = SlotKV(two_full, rows=2, capacity=4)
    kv.add()
    kv.add()
    forward(kv, [3, 2])
    before = [kv.save(row) for row in (0, 1)]
    allocate, made = kv._empty, 0

    def empty(columns: int) -> torch.Tensor:
        nonlocal made
        made += 1
        if made > 2:  # the first layer's keys and values grew, the second layer's did not
            raise torch.OutOfMemoryError("CUDA out of memory")
        return allocate(columns)

    kv._empty = empty  # type: ignore[method-assign]
    with pytest.raises(torch.OutOfMemoryError):
        forward(kv, [5], first=0)
    kv._empty = allocate  # type: ignore[method-assign]
    assert kv.capacity == 4 and kv.lengths == [3, 2]
    assert {t.shape[2] for pair in kv._full.values() for t in pair} == {4}
    for row, state in enumerate(before):
        after = kv.save(row)
        assert all(torch.equal(a, b) for a, b in zip(after.tensors(), state.tensors(), strict=True))
    forward(kv, [5], first=0)  # grows from the one width
    assert kv.capacity == 8 and full(kv, 0) == list(range(8))


def test_removing_a_row_moves_the_last_row_into_its_place() -> None:
    kv = SlotKV(LAYOUT, rows=3)
    for _ in range(3):
        kv.add()
    forward(kv, [2, 3, 5])
    kv.remove(0)
    assert kv.count == 2 and kv.lengths == [5, 3]
    assert full(kv, 0) == [2000, 2001, 2002, 2003, 2004] and full(kv, 1) == [1000, 1001, 1002]
    assert ring(kv, 0) == [2004, 2001, 2002, 2003]
    kv.add()  # the third row again: now every row is taken
    with pytest.raises(RuntimeError, match="no free row"):
        kv.add()


def test_a_saved_row_loads_into_another_slotkv_and_continues_where_it_was() -> None:
    source = SlotKV(LAYOUT, rows=1)
    source.add()
    forward(source, [6])
    state = source.save(0)
    assert state.length == 6 and state.nbytes > 0
    target = SlotKV(LAYOUT, rows=2)
    target.add()
    target.add(state)
    assert target.lengths == [0, 6]
    other = SlotKV(LAYOUT, rows=1)
    other.add()
    other.transfer(source, 0, 0)
    assert full(other, 0) == full(target, 1) == list(range(6))
    assert ring(other, 0) == ring(target, 1) == [4, 5, 2, 3]


def test_a_transformers_cache_of_the_last_window_positions_lands_in_ring_columns() -> None:
    """``generate``'s sliding layers hold the last ``window - 1`` positions (here 7, 8, 9)."""
    length = 10
    held = torch.tensor([7.0, 8.0, 9.0]).reshape(1, 1, 3, 1)
    every = torch.arange(float(length)).reshape(1, 1, length, 1)
    cache = SimpleNamespace(
        get_seq_length=lambda: length,
        layers=[SimpleNamespace(keys=every, values=every), SimpleNamespace(keys=held, values=held)],
    )
    state = KVState.of_cache(cache, LAYOUT)
    assert state.length == length
    assert state.ring[0][0].flatten().tolist() == [8.0, 9.0, 0.0, 7.0]  # column 2 comes next
    with pytest.raises(ValueError, match="a cache of 1 layers"):
        KVState.of_cache(SimpleNamespace(get_seq_length=lambda: 1, layers=[None]), LAYOUT)


def test_a_layer_type_it_does_not_know_is_refused() -> None:
    config = SimpleNamespace(
        layer_types=["full_attention", "chunked_attention"],
        sliding_window=4,
        num_key_value_heads=1,
        head_dim=1,
    )
    with pytest.raises(ValueError, match="chunked_attention"):
        LayerLayout.of(config, torch.float32, torch.device("cpu"))


def test_a_forward_over_a_run_of_rows_leaves_the_others_as_they_were() -> None:
    kv = SlotKV(LAYOUT, rows=3)
    for _ in range(3):
        kv.add()
    forward(kv, [2, 1, 3])
    read = forward(kv, [3, 1], first=1)  # rows 1 and 2: a wide forward, row 0 keeps still
    assert kv.lengths == [2, 4, 4]
    assert full(kv, 0) == [0, 1] and ring(kv, 0) == [0, 1]
    assert full(kv, 1) == [1000, 1001, 1002, 1003] and ring(kv, 1) == [1000, 1001, 1002, 1003]
    assert full(kv, 2) == [2000, 2001, 2002, 2003]
    assert read[FULL][1, :4].tolist() == [2000, 2001, 2002, 2003]  # its own columns, no other
    read = forward(kv, [1, 1], first=0)  # rows 0 and 1 decode; row 2 keeps still
    assert kv.lengths == [3, 5, 4]
    assert read[FULL][0, :3].tolist() == [0, 1, 2]
    assert read[SLIDING][1].tolist() == [1004, 1001, 1002, 1003]
    assert full(kv, 2) == [2000, 2001, 2002, 2003]


def test_a_forward_past_the_occupied_rows_is_refused() -> None:
    kv = SlotKV(LAYOUT, rows=3)
    kv.add()
    kv.add()
    with pytest.raises(ValueError, match=r"rows 1\.\.2 of 2"):
        kv.plan([1, 1], first=1)


def test_swapping_two_rows_exchanges_their_columns_and_lengths() -> None:
    kv = SlotKV(LAYOUT, rows=3)
    for _ in range(3):
        kv.add()
    forward(kv, [2, 6, 1])
    kv.swap(0, 1)
    assert kv.lengths == [6, 2, 1]
    assert full(kv, 0) == [1000 + p for p in range(6)] and full(kv, 1) == [0, 1]
    assert ring(kv, 0) == [1004, 1005, 1002, 1003] and ring(kv, 1) == [0, 1]
    assert full(kv, 2) == [2000]
    forward(kv, [1, 1, 1])  # each goes on from its own length, in its new row
    assert full(kv, 1) == [0, 1, 1002]  # row 1's marks: the key it wrote there
    assert kv.lengths == [7, 3, 2]


def attended(read: dict[str, torch.Tensor], query: int) -> set[int]:
    """The marks of the sliding keys row 0's ``query``-th new token reads."""
    mask = read[f"{SLIDING}_mask"][0, 0, query]
    return {int(k) for k, seen in zip(read[SLIDING][0], mask, strict=True) if seen}


@pytest.mark.parametrize("length", [3, 4, 7, 9])  # under, at and past the window (4)
def test_a_state_cut_back_is_kept_only_where_its_ring_holds_what_comes_next(length: int) -> None:
    source = SlotKV(LAYOUT, rows=1)
    source.add()
    forward(source, [length])
    state = source.save(0)
    assert state.ring_from == max(0, length - WINDOW)
    for kept in range(1, length + 1):
        cut = state.cropped(kept, WINDOW)
        # under the window every position has its column; past it the ring holds one more
        # position than the next token reads: a cut of one token still leaves those
        assert (cut is not None) == (length <= WINDOW or kept >= length - 1), kept
        if cut is None:
            continue
        for tokens in (1, 3):  # a decode step, a prefill
            kv = SlotKV(LAYOUT, rows=1)
            kv.add(cut)
            read = forward(kv, [tokens])
            for t in range(tokens):
                p = kept + t
                assert attended(read, t) == set(range(max(0, p - WINDOW + 1), p + 1)), (kept, t)
            assert full(kv, 0) == list(range(kept + tokens))


def test_a_ring_lacking_a_column_says_so_until_a_forward_fills_it() -> None:
    source = SlotKV(LAYOUT, rows=1)
    source.add()
    forward(source, [9])
    cut = source.save(0).cropped(8, WINDOW)  # position 8's column: the next token's
    assert cut is not None and cut.ring_from == 5
    kv = SlotKV(LAYOUT, rows=2)
    kv.add()
    kv.add(cut)
    kv.swap(0, 1)
    assert kv.save(0).ring_from == 5  # saved as it came: not cut back again
    assert kv.save(0).cropped(7, WINDOW) is None
    forward(kv, [1], first=0)
    assert kv.save(0).ring_from == 9 - WINDOW
    assert kv.save(0).cropped(8, WINDOW) is not None


def test_a_state_cut_back_past_its_ring_to_a_mark_reads_the_window_the_mark_held() -> None:
    source = SlotKV(LAYOUT, rows=1)
    source.add()
    forward(source, [6])
    marked = source.save(0)  # a turn boundary at 6, past the window (4)
    kv = SlotKV(LAYOUT, rows=1)
    kv.add(marked)
    forward(kv, [5])  # the next turn: its ring no longer holds what position 6 reads
    state = kv.save(0)
    assert state.cropped(6, WINDOW) is None
    cut = state.at_mark(marked.mark())
    assert cut.length == 6 and [int(x) for x in cut.full[0][0].flatten()] == list(range(6))
    again = SlotKV(LAYOUT, rows=1)
    again.add(cut)
    read = forward(again, [1])
    assert attended(read, 0) == {3, 4, 5, 6}  # the window of position 6, none of the later ring
    assert [int(x) for x in marked.ring[0][0].flatten()] == [4, 5, 2, 3]  # never written
