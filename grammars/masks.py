"""Allowed-token masks: a vectorized walk of the token trie through a byte automaton.

`compute_mask` walks in C where the native walk is built (`native_walk`, depth-first over the
automaton's own rows, with the text shortcuts below; the walk table is then never filled); the
numpy walk below is its fallback and twin, and the tests hold both to a per-token reference.

The walk goes one trie depth at a time and keeps, for every trie node, the automaton state
reached by reading its bytes from the start state (dead where the automaton stops). Each
depth is one gather through a flat copy of the automaton's transition table (`WalkTable`),
encoded so that the dead state needs no special case:

    value 0            dead
    value (s+1)*256    state s, i.e. the offset of s's row; the child's value is
                       table[parent value + child byte]
    value -1           in table entries only: that row is not computed yet

A depth where few nodes are alive expands only their children (a frontier); a depth where
many are alive processes the whole depth at once, which has no index bookkeeping. A token is
allowed when its trie node is alive.

Shortcut for string content: when every plain byte (printable ASCII but `"` and `\\`, see
`PLAIN_BYTES`) leads the start state to one same state, all plain-prefix nodes of depth 1 hold
that state, and so on down while the chain of states stays that way (a JSON string's content
state loops; under `maxLength` it counts). Those depths walk only the other nodes; a plain
node gets its value written only where a child needs it, and a plain token is alive when the
chain is alive at its depth. Plain nodes are most of the trie.

Shortcut for free text: when the start state loops on every plain byte and reads well-formed
UTF-8 characters back to itself (free JSON string content; `WalkTable.text_states` checks the
automaton against `TEXT_MOVES` state by state), every token whose bytes are text is allowed
and its state is known from its UTF-8 phase, so the walk reads only the nodes that are not
text (those with a quote, a backslash, a control byte or broken UTF-8 in their prefix).

Shortcut for text subtrees: a walk from any other state stops at a node whose prefix is whole
characters of text and whose state reads text (a property name once it no longer starts a
declared one, say). Every text token under it is allowed (`TokenizerIndex.pre`/`size` give
its subtree as an interval), and only the nodes under it that are not text are walked, from
their text parents' states by UTF-8 phase, as in the free text shortcut.

The tail: below depth `TokenizerIndex.tail_depth` (16 for SmolLM2) the trie holds a few long
tokens, mostly runs of one byte (`####...`, `----...`, newline and spaces), which a walk by
depth would take ~65 more depths, a dozen numpy calls each, to read. Every walk stops at that
depth, and `tail_values` walks the rest by runs (`TokenizerIndex.tail`): all the runs of a
level step together, and once no run's state changes on its byte (a state that loops on it,
or dead) the remaining bytes of every run are known at once.
"""

from __future__ import annotations

import numpy as np
import torch

from .automaton import ByteAutomaton
from .native_walk import TextStates, native_mask, trie_walk
from .states import DICT_ENTRY_BYTES
from .tokenizer_index import NOT_TEXT, NUM_PHASES, PLAIN_BYTES, TEXT_MOVES, TokenizerIndex

_DEAD = 0
_PENDING = -1
# Use the frontier for the next depth when fewer than 1/_SPARSE of its nodes could be alive.
_SPARSE = 8
# Look for text subtrees only in the first _ABSORB_DEPTHS depths (where nearly all of them
# start; deeper, looking at every depth costs more than it saves) and only where at least
# _ABSORB_MIN nodes are alive (fewer cost less to walk than to look at).
_ABSORB_DEPTHS = 4
_ABSORB_MIN = 64


def allocate_token_bitmask(batch: int, vocab_size: int) -> torch.Tensor:
    """An int32 [batch, ceil(vocab_size/32)] bitmask with every token allowed (xgrammar layout)."""
    if batch < 1 or vocab_size < 1:
        raise ValueError(f"batch ({batch}) and vocab_size ({vocab_size}) must be positive")
    return torch.full((batch, (vocab_size + 31) // 32), -1, dtype=torch.int32)


class WalkTable:
    """A flat, lazily filled copy of an automaton's rows in the walk's value encoding.

    The table always has room for every state that a filled row leads to, so a walk reads
    only valid offsets: a row not filled yet reads as pending.
    """

    def __init__(self, automaton: ByteAutomaton):
        self.automaton = automaton
        self.flat = np.full(2 * 256, _PENDING, dtype=np.int32)  # grown as rows are filled
        self.flat[:256] = _DEAD
        self._plain: dict[int, int | None] = {}
        self._text: dict[int, list[int] | None] = {}
        self._reads_text = np.zeros(256, dtype=np.int8)  # per state: 0 unknown, 1 yes, 2 no
        self.native_text = TextStates()  # the native walk's own record of the same

    def containers(self) -> list:
        """The dicts this table alone holds (see `reaper`)."""
        return [self._plain, self._text]

    @property
    def nbytes(self) -> int:
        dicts = (len(self._plain) + len(self._text)) * DICT_ENTRY_BYTES
        kept = self.flat.nbytes + self._reads_text.nbytes + self.native_text.nbytes
        return kept + dicts

    def reads_text(self, states: np.ndarray) -> np.ndarray:
        """Whether `text_states` of each of `states` (ints >= 0) is not None."""
        top = int(states.max()) + 1
        if top > self._reads_text.shape[0]:
            grown = np.zeros(max(top, 2 * self._reads_text.shape[0]), dtype=np.int8)
            grown[: self._reads_text.shape[0]] = self._reads_text
            self._reads_text = grown
        got = self._reads_text.take(states)
        unknown = got == 0
        if unknown.any():
            for s in np.unique(states[unknown]).tolist():
                self._reads_text[s] = 2 if self.text_states(s) is None else 1
            got = self._reads_text.take(states)
        return got == 1

    def text_states(self, state: int) -> list[int] | None:
        """The state after text in each UTF-8 phase from `state` (phase 0 = `state`), when
        `state` reads text as `TEXT_MOVES` says (each move's bytes lead to one same state,
        back to `state` after each whole character); else None."""
        if state in self._text:
            return self._text[state]
        got: list[int] | None = None
        if self.plain_successor(state) == state:
            got = [state] + [-1] * (NUM_PHASES - 1)
            for at, data, nxt in TEXT_MOVES:
                targets = self.automaton.row(got[at])[data]
                target = int(targets[0])
                if target < 0 or (targets != target).any() or got[nxt] not in (-1, target):
                    got = None
                    break
                got[nxt] = target
        self._text[state] = got
        return got

    def plain_successor(self, state: int) -> int | None:
        """The state every plain byte leads `state` to (-1 = dead), None if they differ."""
        got = self._plain.get(state, _PENDING)
        if got == _PENDING:
            targets = self.automaton.row(state)[PLAIN_BYTES]
            got = int(targets[0]) if (targets == targets[0]).all() else None
            self._plain[state] = got
        return got

    def value(self, state: int) -> int:
        """Walk value of `state` (its row is filled when a walk first reads it)."""
        self._grow((state + 2) * 256)
        return (state + 1) * 256

    def fill(self, states: list[int]) -> None:
        """Compute and copy the rows of `states` (ints >= 0)."""
        rows = np.stack([self.automaton.row(s) for s in states])
        self._grow((max(max(states), int(rows.max())) + 2) * 256)
        rows += 1  # dead (-1) becomes value 0
        rows *= 256
        self.flat.reshape(-1, 256)[np.asarray(states) + 1] = rows

    def step(self, values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Child values for `values` = parent value + child byte; fills pending rows first."""
        nxt = self.flat.take(values, out=out)
        if nxt.size and nxt.min() < 0:
            pending = np.flatnonzero(nxt < 0)
            self.fill((np.unique(values[pending] >> 8) - 1).tolist())
            nxt[pending] = self.flat.take(values[pending])
        return nxt

    def _grow(self, size: int) -> None:
        if size > self.flat.shape[0]:
            grown = np.full(max(size, 2 * self.flat.shape[0]), _PENDING, dtype=np.int32)
            grown[: self.flat.shape[0]] = self.flat
            self.flat = grown


def node_values(
    index: TokenizerIndex, table: WalkTable, state: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Walk values from `state`: (int32[num_nodes + 1] per node, 0 = dead and last = 0;
    bool per depth: plain nodes of that depth are alive though their value was not written;
    None, or per preorder number (and one past the last) non-zero inside a text subtree,
    whose text nodes are alive though their value was not written)."""
    values = np.zeros(index.num_nodes + 1, dtype=np.int32)
    values[0] = table.value(state)
    absorbed: list[tuple[np.ndarray, np.ndarray]] = []
    starts = index.depth_start
    plain_alive = np.zeros(starts.shape[0], dtype=bool)
    last = min(starts.shape[0] - 1, index.tail_depth + 1)  # one past the last depth walked here
    first = _plain_depths(index, table, state, values, plain_alive)
    if first == 1:
        live = np.zeros(1, dtype=np.int64)  # alive nodes of the previous depth
        dense = False
    else:
        live = np.flatnonzero(values[starts[first - 1] : starts[first]]) + starts[first - 1]
        dense = live.size * _SPARSE >= int(starts[min(first + 1, last)] - starts[first])
    for d in range(first, last):
        if live.size == 0:
            break
        lo, hi = int(starts[d]), int(starts[d + 1])
        if dense:
            step = values.take(index.parent[lo:hi])
            np.add(step, index.byte[lo:hi], out=step)
            table.step(step, out=values[lo:hi])
            live = np.flatnonzero(values[lo:hi]) + lo
        else:
            counts = index.child_count[live]
            ends = np.cumsum(counts)
            if ends[-1] == 0:
                break
            nodes = np.arange(int(ends[-1])) + np.repeat(
                index.child_start[live] - (ends - counts), counts
            )
            step = np.repeat(values[live], counts) + index.byte[nodes]
            got = table.step(step)
            values[nodes] = got
            live = nodes[got != _DEAD]
        if d <= _ABSORB_DEPTHS and live.size >= _ABSORB_MIN:
            live = _absorb(index, table, values, live, absorbed)
        dense = live.size * _SPARSE >= int(starts[min(d + 2, last)]) - hi
    owner = _text_subtrees(index, table, values, absorbed) if absorbed else None
    tail_values(index, table, values)
    values[0] = _DEAD
    return values, plain_alive, owner


def _absorb(
    index: TokenizerIndex,
    table: WalkTable,
    values: np.ndarray,
    live: np.ndarray,
    absorbed: list[tuple[np.ndarray, np.ndarray]],
) -> np.ndarray:
    """`live` less its nodes that start a text subtree (whole characters of text, children,
    a state that reads text); those are zeroed and kept in `absorbed` with their states."""
    stop = (index.text_phase.take(live) == 0) & (index.child_count.take(live) > 0)
    if not stop.any():
        return live
    states = (values.take(live[stop]) >> 8) - 1
    stop[stop] = table.reads_text(states)
    if not stop.any():
        return live
    nodes = live[stop]
    absorbed.append((nodes, (values.take(nodes) >> 8) - 1))
    values[nodes] = _DEAD  # the walk goes on below the other nodes only
    return live[~stop]


def _text_subtrees(
    index: TokenizerIndex,
    table: WalkTable,
    values: np.ndarray,
    absorbed: list[tuple[np.ndarray, np.ndarray]],
) -> np.ndarray:
    """Values of the nodes under `absorbed` that are not text (and of the text ones of depth
    `tail_depth`, which the tail reads); per preorder number, 1 + which reading state's subtree
    it is in (0 outside)."""
    nodes = np.concatenate([n for n, _ in absorbed])
    kinds, which = np.unique(np.concatenate([s for _, s in absorbed]), return_inverse=True)
    by_phase = np.array(
        [[table.value(t) for t in table.text_states(k)] for k in kinds.tolist()], dtype=np.int32
    )
    owner = np.zeros(index.num_nodes + 1, dtype=np.int32)
    starts = index.pre.take(nodes)
    owner[starts] = which + 1  # the subtrees are disjoint: a start or an end is never shared
    owner[starts + index.size.take(nodes)] -= which.astype(np.int32) + 1
    np.cumsum(owner, out=owner)
    feed = owner.take(index.text_feed_pre)
    at = np.flatnonzero(feed)
    values[index.text_feed_nodes[at]] = by_phase[feed[at] - 1, index.text_feed_phase[at]]
    rough = index.rough_start
    first = int(np.searchsorted(index.depth_start, nodes.min(), side="right"))
    for d in range(first, min(rough.shape[0] - 1, index.tail_depth + 1)):
        lo, hi = rough[d], rough[d + 1]
        if lo < hi:  # every node not text has a parent that is not text or a feed node
            step = values.take(index.rough_parent[lo:hi])
            np.add(step, index.rough_byte[lo:hi], out=step)
            values[index.rough_nodes[lo:hi]] = table.step(step)
    roots = index.tail_roots
    if roots.size:
        phase = index.text_phase.take(roots)
        inside = owner.take(index.pre.take(roots))
        at = np.flatnonzero((inside != 0) & (phase != NOT_TEXT))
        values[roots[at]] = by_phase[inside[at] - 1, phase[at]]
    return owner


def _plain_depths(
    index: TokenizerIndex,
    table: WalkTable,
    state: int,
    values: np.ndarray,
    plain_alive: np.ndarray,
) -> int:
    """Walk depths 1.. by the string-content shortcut while it applies; the next depth."""
    d = 1
    last = min(index.depth_start.shape[0] - 1, index.tail_depth + 1)
    while True:
        nxt = table.plain_successor(state) if d < last else None
        if nxt is None:
            if d > 1:  # the full walk (or the tail) from depth d reads every node of d - 1
                plain = index.plain_nodes[index.plain_start[d - 1] : index.plain_start[d]]
                values[plain] = table.value(state)
            break
        if d > 1:
            feed = index.feed_nodes[index.feed_start[d - 1] : index.feed_start[d]]
            values[feed] = table.value(state)
        lo, hi = index.other_start[d], index.other_start[d + 1]
        step = values.take(index.other_parent[lo:hi])
        np.add(step, index.other_byte[lo:hi], out=step)
        values[index.other_nodes[lo:hi]] = table.step(step)
        d += 1
        if nxt < 0:
            break
        plain_alive[d - 1] = True
        state = nxt
    return d


def text_values(index: TokenizerIndex, table: WalkTable, states: list[int]) -> np.ndarray:
    """Walk values of the nodes that are not text (0 = dead), from the states after text in
    each UTF-8 phase (`WalkTable.text_states`); text nodes without such a child stay 0."""
    values = np.zeros(index.num_nodes + 1, dtype=np.int32)
    by_phase = np.array([table.value(s) for s in states], dtype=np.int32)
    values[index.text_feed_nodes] = by_phase.take(index.text_feed_phase)
    starts = index.rough_start
    for d in range(1, min(starts.shape[0] - 1, index.tail_depth + 1)):
        lo, hi = starts[d], starts[d + 1]
        if lo < hi:
            step = values.take(index.rough_parent[lo:hi])
            np.add(step, index.rough_byte[lo:hi], out=step)
            values[index.rough_nodes[lo:hi]] = table.step(step)
    roots = index.tail_roots  # the tail reads them: text ones by their phase
    if roots.size:
        phase = index.text_phase.take(roots)
        text = phase != NOT_TEXT
        values[roots[text]] = by_phase.take(phase[text])
        tail_values(index, table, values)
    return values


def tail_values(index: TokenizerIndex, table: WalkTable, values: np.ndarray) -> None:
    """Write the values of the nodes deeper than the index's `tail_depth`, from those of that
    depth, by runs of one byte (see module docstring)."""
    if not index.tail or not values.take(index.tail_roots).any():
        return  # the tail hangs below these: all of it stays dead (0)
    for level in index.tail:
        cur = values.take(level.src)
        if not cur.any():
            continue  # every node of the level stays dead (0)
        kstart, nodes = level.kstart, level.nodes
        for j in range(1, kstart.shape[0] - 1):
            lo, hi = int(kstart[j]), int(kstart[j + 1])
            cur = cur[: hi - lo]
            nxt = table.step(cur + level.byte[: hi - lo])
            values[nodes[lo:hi]] = nxt
            if (nxt == cur).all():  # each run's state loops on its byte: so do the rest
                values[nodes[hi:]] = nxt.take(level.group[hi:])
                break
            cur = nxt


def compute_mask(index: TokenizerIndex, table: WalkTable, state: int) -> np.ndarray:
    """Packed int32[num_words] mask of the tokens allowed in `state` (EOS when accepting), by
    the native walk where it is built (`native_walk`), else the numpy walk."""
    fn = trie_walk()
    if fn is None:
        return numpy_mask(index, table, state)
    words, _steps = native_mask(fn, index, table.automaton, table.native_text, state)
    if index.same_bytes_token.size:  # the walk set one token per node: copy its bit over
        src = index.same_bytes_as
        on = (words.view(np.uint32).take(src >> 5) >> (src & 31).astype(np.uint32)) & 1
        _set_bits(words, index.same_bytes_token[on.astype(bool)])
    if table.automaton.is_accepting(state):
        _set_bits(words, np.array(index.eos_ids, dtype=np.int64))
    return words


def numpy_mask(index: TokenizerIndex, table: WalkTable, state: int) -> np.ndarray:
    """`compute_mask` by the numpy walk."""
    text = table.text_states(state)
    if text is not None:
        # Text tokens are all allowed: start from their packed mask, add the others alive.
        values = text_values(index, table, text)
        words = index.text_words.copy()
        alive = index.rough_tokens[values.take(index.rough_token_nodes) != _DEAD]
        _set_bits(words, alive)
        if table.automaton.is_accepting(state):
            _set_bits(words, np.array(index.eos_ids, dtype=np.int64))
        return words
    values, plain_alive, owner = node_values(index, table, state)
    allowed = values.take(index.mask_node) != _DEAD
    if plain_alive.any():
        allowed |= plain_alive.take(index.mask_depth)
    if owner is not None:
        allowed |= (owner.take(index.mask_pre) != 0) & index.mask_text
    if table.automaton.is_accepting(state):
        allowed[list(index.eos_ids)] = True
    return np.packbits(allowed, bitorder="little").view("<i4").astype(np.int32, copy=False)


def _set_bits(words: np.ndarray, tokens: np.ndarray) -> None:
    """Set the bits of `tokens` in a packed int32 mask."""
    bits = np.left_shift(np.uint32(1), (tokens & 31).astype(np.uint32))
    np.bitwise_or.at(words.view(np.uint32), tokens >> 5, bits)
