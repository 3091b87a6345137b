"""Per-tokenizer data for mask computation: each token's bytes and a byte trie over them.

Built once per (tokenizer, vocab size) and reused by every grammar compiled for it.

Trie layout (breadth-first, children of a node contiguous and sorted by byte)::

    node 0 = root (empty prefix)
    node n: byte[n]      the byte on the edge into n
            parent[n]    its parent (non-decreasing over n)
            child_start[n], child_count[n]  its children are nodes child_start .. +count
    depth_start[d]       nodes of depth d (prefix length d) are depth_start[d] .. depth_start[d+1]
    token_node[t]        the node whose prefix equals token t's bytes, -1 for a token that
                         grammars never allow (special, added, empty, or padding ids)
    mask_node[i]         for every bit i of a packed mask row: token i's node, or num_nodes
                         (one past the last node) where no token may be allowed

Nodes are also split by whether every byte of their prefix is in PLAIN_BYTES (printable ASCII
but `"` and `\\`, the bytes that leave JSON string content alone): `plain_nodes` and
`other_nodes`, each in node order, with `plain_start[d]` / `other_start[d]` where depth d
begins in them; `other_parent` and `other_byte` are the parent and byte of each other node;
`feed_nodes` / `feed_start` the plain nodes with a child that is not plain; `mask_depth[i]`
the depth of mask bit i's token node when that node is plain, else 0.

A second split is by whether a node's prefix is JSON string text: plain bytes and well-formed
UTF-8 (a last character may be incomplete). `text_phase[n]` is where in a UTF-8 character the
prefix ends (the phase of `TEXT_MOVES`, 0 = between characters; `NOT_TEXT` for the other
nodes); `rough_nodes` / `rough_start` / `rough_parent` / `rough_byte` list the nodes that are
not text by depth, `text_feed_nodes` (with `text_feed_phase`) the text nodes with a child that
is not, `text_words` the packed mask of the tokens that are text, and `rough_tokens` /
`rough_token_nodes` the tokens that are not (ids, nodes); `mask_text[i]` whether mask bit i's
token is text.

`pre[n]` numbers the nodes in depth-first preorder (children by byte), so the subtree of n is
the nodes numbered `pre[n]` .. `pre[n] + size[n]`; `mask_pre[i]` is that number for mask bit i's
token node (num_nodes where there is none) and `text_feed_pre` for each text feed node. For
the native depth-first walk (`trie_walk.c`) the nodes are also listed in that order:
`pre_byte`, `pre_depth` and `pre_size` of each, and `pre_token`, the (lowest) token each
spells, else `num_words * 32` (a bit past the mask); a token with the same bytes as a lower
one is in `same_bytes_token`, beside that one in `same_bytes_as`.

Nodes deeper than `tail_depth` (the few long tokens: runs of `#`, `-`, `=`, spaces, ~80 bytes
deep) are `tail` levels, walked by runs instead of one depth at a time. A tail node's trailing
run is the bytes, all equal to its own, back to `src` (a tail node or one of depth
`tail_depth`), `k` of them; its level is one more than `src`'s (0 at depth `tail_depth`).
`tail_depth` is the first of `TAIL_DEPTHS` whose tail has at most `MAX_TAIL_LEVELS` levels
(long tokens that are not runs of one byte, such as repeated multi-byte characters, make a
level per byte); when none does, there is no tail and `tail_depth` is the trie's depth. In a
level, each (src, byte) pair is a group, ordered by run length, longest first; `nodes` lists
the level's nodes by k, then by group, so the nodes at k = j are groups 0.. of that slice
(`kstart[j]` .. `kstart[j + 1]`), and `group` holds each node's group.
"""

from __future__ import annotations

import re
import threading
import weakref
from dataclasses import dataclass

import numpy as np

TAIL_DEPTHS = (16, 20, 24, 32, 48, 64)
MAX_TAIL_LEVELS = 12
PLAIN_BYTES = np.array([b for b in range(0x20, 0x7F) if b not in b'"\\'], dtype=np.uint8)
NOT_TEXT = 255


def _text_moves() -> list[tuple[int, np.ndarray, int]]:
    """(phase, bytes, next phase) of well-formed UTF-8 over plain ASCII: phase 0 is between
    characters; each lead byte group (its own second-byte range) has phases of its own."""
    cont = range(0x80, 0xC0)
    groups = [  # (lead bytes, second bytes, character length)
        (range(0xC2, 0xE0), cont, 2),
        ([0xE0], range(0xA0, 0xC0), 3),
        ([*range(0xE1, 0xED), 0xEE, 0xEF], cont, 3),
        ([0xED], range(0x80, 0xA0), 3),  # no surrogates
        ([0xF0], range(0x90, 0xC0), 4),
        (range(0xF1, 0xF4), cont, 4),
        ([0xF4], range(0x80, 0x90), 4),  # nothing past U+10FFFF
    ]
    moves = [(0, PLAIN_BYTES, 0)]
    phases = 1
    for leads, second, length in groups:
        moves.append((0, np.array(leads, dtype=np.uint8), phases))
        for k in range(length - 1):
            nxt = 0 if k == length - 2 else phases + 1
            moves.append((phases, np.array(second if k == 0 else cont, dtype=np.uint8), nxt))
            phases += 1
    return moves


TEXT_MOVES = _text_moves()
NUM_PHASES = 1 + max(nxt for _at, _data, nxt in TEXT_MOVES)


def _next_phase() -> np.ndarray:
    """uint8[NUM_PHASES, 256]: the phase after each byte of `TEXT_MOVES`, NOT_TEXT where the
    byte ends text."""
    table = np.full((NUM_PHASES, 256), NOT_TEXT, dtype=np.uint8)
    for at, data, nxt in TEXT_MOVES:
        table[at, data] = nxt
    return table


NEXT_PHASE = _next_phase()
_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable unicode characters."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


_UNICODE_TO_BYTE = {c: b for b, c in _byte_to_unicode().items()}


@dataclass(frozen=True)
class TailLevel:
    """One level of the trie's tail, walked by runs of one byte (see module docstring)."""

    src: np.ndarray  # int32[groups]: the node each group's run starts after
    byte: np.ndarray  # int32[groups]: the run's byte
    nodes: np.ndarray  # int32: the level's nodes, by k, then by group
    kstart: np.ndarray  # int64[max k + 2]: nodes at k = j are nodes[kstart[j]:kstart[j + 1]]
    group: np.ndarray  # int64: each node's group (same order as `nodes`)


@dataclass(frozen=True)
class TokenizerIndex:
    """Token bytes and the byte trie for one vocabulary (see module docstring)."""

    vocab_size: int
    token_bytes: tuple[bytes | None, ...]  # None: never allowed by a grammar
    eos_ids: tuple[int, ...]
    byte: np.ndarray  # uint8[num_nodes]
    parent: np.ndarray  # int32[num_nodes]
    depth_start: np.ndarray  # int64[max token length + 2]
    child_start: np.ndarray  # int64[num_nodes]
    child_count: np.ndarray  # int64[num_nodes]
    token_node: np.ndarray  # int64[vocab_size]
    mask_node: np.ndarray  # int32[num_words * 32]
    plain_nodes: np.ndarray  # int32
    plain_start: np.ndarray  # int64[max token length + 2]
    other_nodes: np.ndarray  # int32
    other_start: np.ndarray  # int64[max token length + 2]
    other_parent: np.ndarray  # int32
    other_byte: np.ndarray  # uint8
    feed_nodes: np.ndarray  # int32
    feed_start: np.ndarray  # int64[max token length + 2]
    mask_depth: np.ndarray  # int32[num_words * 32]
    text_phase: np.ndarray  # uint8[num_nodes]
    rough_nodes: np.ndarray  # int32
    rough_start: np.ndarray  # int64[max token length + 2]
    rough_parent: np.ndarray  # int32
    rough_byte: np.ndarray  # uint8
    text_feed_nodes: np.ndarray  # int32
    text_feed_phase: np.ndarray  # uint8
    text_words: np.ndarray  # int32[num_words]
    rough_tokens: np.ndarray  # int64
    rough_token_nodes: np.ndarray  # int64
    mask_text: np.ndarray  # bool[num_words * 32]
    pre: np.ndarray  # int32[num_nodes]
    size: np.ndarray  # int32[num_nodes]
    mask_pre: np.ndarray  # int32[num_words * 32]
    text_feed_pre: np.ndarray  # int32
    pre_byte: np.ndarray  # uint8[num_nodes], by preorder number
    pre_depth: np.ndarray  # int32[num_nodes]
    pre_size: np.ndarray  # int32[num_nodes]
    pre_token: np.ndarray  # int32[num_nodes]
    same_bytes_token: np.ndarray  # int64
    same_bytes_as: np.ndarray  # int64
    tail_depth: int
    tail: tuple[TailLevel, ...]
    tail_roots: np.ndarray  # int32: nodes of depth tail_depth with children

    @property
    def num_words(self) -> int:
        """Length of one packed bitmask row."""
        return (self.vocab_size + 31) // 32

    @property
    def num_nodes(self) -> int:
        return int(self.byte.shape[0])


def _decoder_kind(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        text = str(backend.decoder)
        if "ByteLevel" in text:
            return "bytelevel"
        if "ByteFallback" in text or "Metaspace" in text or "\u2581" in text:
            return "sentencepiece"
    return "sentencepiece" if "\u2581" in "".join(tokenizer.get_vocab())[:100000] else "plain"


def _token_to_bytes(token: str, kind: str) -> bytes | None:
    if kind == "bytelevel":
        try:
            return bytes(_UNICODE_TO_BYTE[c] for c in token)
        except KeyError:
            return token.encode("utf-8")
    if kind == "sentencepiece":
        fallback = _BYTE_FALLBACK.match(token)
        if fallback:
            return bytes([int(fallback.group(1), 16)])
        return token.replace("\u2581", " ").encode("utf-8")
    return token.encode("utf-8")


def _special_ids(tokenizer) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(int(i) for i in decoder)
    return ids


def _eos_ids(tokenizer, eos_token_ids) -> tuple[int, ...]:
    if eos_token_ids is not None:
        return tuple(sorted({int(i) for i in eos_token_ids}))
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(sorted({int(i) for i in (eos if isinstance(eos, list) else [eos])}))


def build_tokenizer_index(tokenizer, vocab_size: int | None = None, eos_token_ids=None):
    """Build the index for `tokenizer`; `vocab_size` is the model's (>= the tokenizer's)."""
    vocab = tokenizer.get_vocab()
    n_tok = max(len(tokenizer), max(vocab.values()) + 1)
    size = n_tok if vocab_size is None else int(vocab_size)
    if size < n_tok:
        raise ValueError(f"vocab_size {size} is smaller than the tokenizer's {n_tok} tokens")
    kind = _decoder_kind(tokenizer)
    special = _special_ids(tokenizer)
    token_bytes: list[bytes | None] = [None] * size
    for token, idx in vocab.items():
        if idx in special:
            continue
        data = _token_to_bytes(token, kind)
        token_bytes[idx] = data or None
    eos = _eos_ids(tokenizer, eos_token_ids)
    return _build_index(token_bytes, eos)


def _build_index(token_bytes: list[bytes | None], eos_ids: tuple[int, ...]) -> TokenizerIndex:
    prefixes = {d[:k] for d in set(token_bytes) if d for k in range(1, len(d) + 1)}
    prefixes.add(b"")
    ordered = sorted(sorted(prefixes), key=len)
    node_of = {p: i for i, p in enumerate(ordered)}
    n = len(ordered)
    byte = np.zeros(n, dtype=np.uint8)
    parent = np.zeros(n, dtype=np.int64)
    byte[1:] = [p[-1] for p in ordered[1:]]
    parent[1:] = [node_of[p[:-1]] for p in ordered[1:]]
    depth = np.fromiter(map(len, ordered), dtype=np.int64, count=n)
    nodes = np.arange(n)
    left = np.searchsorted(parent[1:], nodes, side="left") + 1
    right = np.searchsorted(parent[1:], nodes, side="right") + 1
    token_node = np.array([node_of[d] if d else -1 for d in token_bytes], dtype=np.int64)
    words = (len(token_bytes) + 31) // 32
    mask_node = np.full(words * 32, n, dtype=np.int32)
    mask_node[: len(token_bytes)] = np.where(token_node >= 0, token_node, n)
    depth_start = np.searchsorted(depth, np.arange(int(depth[-1]) + 2))
    plain_byte = np.zeros(256, dtype=bool)
    plain_byte[PLAIN_BYTES] = True
    plain = np.ones(n, dtype=bool)
    for d in range(1, depth_start.shape[0] - 1):
        lo, hi = depth_start[d], depth_start[d + 1]
        plain[lo:hi] = plain[parent[lo:hi]] & plain_byte[byte[lo:hi]]
    plain_nodes, other_nodes = np.flatnonzero(plain), np.flatnonzero(~plain)
    levels = np.arange(depth_start.shape[0])
    feed = np.zeros(n, dtype=bool)
    feed[parent[other_nodes]] = True
    feed_nodes = np.flatnonzero(feed & plain)
    plain_depth = np.where(plain, depth, 0)
    mask_depth = np.zeros(words * 32, dtype=np.int32)
    mask_depth[: len(token_bytes)] = np.where(token_node >= 0, plain_depth[token_node], 0)
    phase = np.zeros(n, dtype=np.uint8)
    moves = np.full((256, 256), NOT_TEXT, dtype=np.uint8)  # NOT_TEXT leads to NOT_TEXT
    moves[:NUM_PHASES] = NEXT_PHASE
    for d in range(1, depth_start.shape[0] - 1):
        lo, hi = depth_start[d], depth_start[d + 1]
        phase[lo:hi] = moves[phase[parent[lo:hi]], byte[lo:hi]]
    text = phase != NOT_TEXT
    rough_nodes = np.flatnonzero(~text)
    text_feed = np.zeros(n, dtype=bool)
    text_feed[parent[rough_nodes]] = True
    text_feed_nodes = np.flatnonzero(text_feed & text)
    mask_text = np.zeros(words * 32, dtype=bool)
    mask_text[: len(token_bytes)] = (token_node >= 0) & text[np.maximum(token_node, 0)]
    rough_tokens = np.flatnonzero((token_node >= 0) & ~text[np.maximum(token_node, 0)])
    pre, size = _preorder(parent, depth_start, left)
    mask_pre = np.full(words * 32, n, dtype=np.int32)
    mask_pre[: len(token_bytes)] = np.where(token_node >= 0, pre[np.maximum(token_node, 0)], n)
    order = np.argsort(pre)  # nodes by preorder number
    tokens = np.flatnonzero(token_node >= 0)
    pre_token = np.full(n, words * 32, dtype=np.int32)
    pre_token[pre[token_node[tokens[::-1]]]] = tokens[::-1]  # the lowest token written last
    same = tokens[pre_token[pre[token_node[tokens]]] != tokens]
    tail_depth, tail = int(depth[-1]), ()
    for candidate in TAIL_DEPTHS:
        runs = _tail_levels(byte, parent, depth, candidate)
        if len(runs) <= MAX_TAIL_LEVELS:
            tail_depth, tail = min(candidate, tail_depth), runs
            break
    return TokenizerIndex(
        vocab_size=len(token_bytes),
        token_bytes=tuple(token_bytes),
        eos_ids=eos_ids,
        byte=byte,
        parent=parent.astype(np.int32),
        depth_start=depth_start,
        child_start=left.astype(np.int64),
        child_count=(right - left).astype(np.int64),
        token_node=token_node,
        mask_node=mask_node,
        plain_nodes=plain_nodes.astype(np.int32),
        plain_start=np.searchsorted(depth[plain_nodes], levels),
        other_nodes=other_nodes.astype(np.int32),
        other_start=np.searchsorted(depth[other_nodes], levels),
        other_parent=parent[other_nodes].astype(np.int32),
        other_byte=byte[other_nodes],
        feed_nodes=feed_nodes.astype(np.int32),
        feed_start=np.searchsorted(depth[feed_nodes], levels),
        mask_depth=mask_depth,
        text_phase=phase,
        rough_nodes=rough_nodes.astype(np.int32),
        rough_start=np.searchsorted(depth[rough_nodes], levels),
        rough_parent=parent[rough_nodes].astype(np.int32),
        rough_byte=byte[rough_nodes],
        text_feed_nodes=text_feed_nodes.astype(np.int32),
        text_feed_phase=phase[text_feed_nodes],
        text_words=np.packbits(mask_text, bitorder="little").view("<i4").astype(np.int32),
        rough_tokens=rough_tokens,
        rough_token_nodes=token_node[rough_tokens],
        mask_text=mask_text,
        pre=pre,
        size=size,
        mask_pre=mask_pre,
        text_feed_pre=pre[text_feed_nodes],
        pre_byte=byte[order],
        pre_depth=depth[order].astype(np.int32),
        pre_size=size[order],
        pre_token=pre_token,
        same_bytes_token=same,
        same_bytes_as=pre_token[pre[token_node[same]]].astype(np.int64),
        tail_depth=tail_depth,
        tail=tail,
        tail_roots=np.unique(parent[depth == tail_depth + 1]).astype(np.int32),
    )


def _preorder(
    parent: np.ndarray, depth_start: np.ndarray, child_start: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(preorder number, subtree size) per node of the breadth-first trie."""
    n = parent.shape[0]
    size = np.ones(n, dtype=np.int64)
    for d in range(depth_start.shape[0] - 2, 0, -1):
        lo, hi = depth_start[d], depth_start[d + 1]
        np.add.at(size, parent[lo:hi], size[lo:hi])
    pre = np.zeros(n, dtype=np.int64)
    for d in range(1, depth_start.shape[0] - 1):
        lo, hi = depth_start[d], depth_start[d + 1]
        before = np.cumsum(size[lo:hi]) - size[lo:hi]  # sizes of the depth's earlier nodes
        first = child_start[parent[lo:hi]] - lo  # each node's first sibling
        pre[lo:hi] = pre[parent[lo:hi]] + 1 + before - before[first]
    return pre.astype(np.int32), size.astype(np.int32)


def _tail_levels(
    byte: np.ndarray, parent: np.ndarray, depth: np.ndarray, tail_depth: int
) -> tuple[TailLevel, ...]:
    """The trie's nodes deeper than `tail_depth` as levels of runs (see module docstring)."""
    src, k, level = {}, {}, {}
    by_level: dict[int, list[int]] = {}
    for n in np.flatnonzero(depth > tail_depth).tolist():  # a parent before its children
        p = int(parent[n])
        if p in src and byte[p] == byte[n]:
            src[n], k[n], level[n] = src[p], k[p] + 1, level[p]
        else:
            src[n], k[n], level[n] = p, 1, level.get(p, 0) + 1
        by_level.setdefault(level[n], []).append(n)
    levels = []
    for lv in range(1, len(by_level) + 1):
        members = by_level[lv]
        runs: dict[tuple[int, int], int] = {}  # (src, byte) -> run length
        for n in members:
            key = (src[n], int(byte[n]))
            runs[key] = max(runs.get(key, 0), k[n])
        order = sorted(runs, key=lambda key: (-runs[key], key))
        group_of = {key: g for g, key in enumerate(order)}
        members.sort(key=lambda n: (k[n], group_of[(src[n], int(byte[n]))]))
        ks = np.array([k[n] for n in members], dtype=np.int64)
        levels.append(
            TailLevel(
                src=np.array([key[0] for key in order], dtype=np.int32),
                byte=np.array([key[1] for key in order], dtype=np.int32),
                nodes=np.array(members, dtype=np.int32),
                kstart=np.searchsorted(ks, np.arange(int(ks[-1]) + 2)),
                group=np.array([group_of[(src[n], int(byte[n]))] for n in members], np.int64),
            )
        )
    return tuple(levels)


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def get_tokenizer_index(tokenizer, vocab_size: int | None = None, eos_token_ids=None):
    """The cached index for this tokenizer object, vocab size and EOS set."""
    key = (vocab_size, None if eos_token_ids is None else tuple(sorted(eos_token_ids)))
    with _LOCK:
        per_tok = _CACHE.setdefault(tokenizer, {})
        if key not in per_tok:
            per_tok[key] = build_tokenizer_index(tokenizer, vocab_size, eos_token_ids)
        return per_tok[key]
