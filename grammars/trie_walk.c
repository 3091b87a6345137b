/* The token trie walked depth-first through a byte automaton's rows, read where the automaton
 * keeps them: `rows[s]` is the address of state s's int32[256] successors (-1 dead), 0 while
 * the row is not computed yet.
 *
 * Nodes are in preorder, so a node's subtree is the `size[i]` nodes from i: a dead node skips
 * its subtree in one step, and `states[d]` holds the state of the current node of depth d (its
 * ancestors are the nodes last seen at each smaller depth). Every alive node sets the bit of
 * the token its prefix spells. Where a node's parent's row is not computed yet, `fill(state,
 * &num_rows)` computes it and returns the rows' addresses as they are now (the table may have
 * been replaced as it grew), or 0 when it failed: the walk stops and returns -1, the error is
 * the caller's (as it does when the row is still missing after `fill`).
 */
#include <stdint.h>

struct trie { /* the index's preorder arrays (tokenizer_index.py) */
    const uint8_t *byte;
    const int32_t *depth;
    const int32_t *size;
    const int32_t *token; /* the token a node spells, or a bit past the mask's last word */
    int64_t max_depth;
};

typedef int64_t (*fill_row)(int32_t state, int64_t *num_rows);

/* Walk the whole trie from `state` and set the bits of the tokens alive in `words`; `states`
 * holds max_depth + 1 states. Returns 0, or -1 when `fill` failed. */
int64_t rf_trie_walk(const int64_t *rows, int64_t num_rows, const struct trie *t, int32_t state,
                     int32_t *states, uint32_t *words, fill_row fill) {
    const uint8_t *byte = t->byte;
    const int32_t *depth = t->depth, *size = t->size;
    const int32_t *token = t->token;
    const int64_t end = size[0];
    states[0] = state;
    for (int64_t i = 1; i < end;) {
        const int32_t d = depth[i];
        const int32_t parent = states[d - 1];
        const int32_t *row = parent < num_rows ? (const int32_t *)rows[parent] : 0;
        if (!row) { /* made now: the walk goes on from the same node */
            rows = (const int64_t *)fill(parent, &num_rows);
            row = rows && parent < num_rows ? (const int32_t *)rows[parent] : 0;
            if (!row) return -1; /* failed, or made no row: never loop on it */
        }
        const int32_t s = row[byte[i]];
        if (s >= 0) {
            states[d] = s;
            words[token[i] >> 5] |= 1u << (token[i] & 31);
            i++;
        } else {
            i += size[i];
        }
    }
    return 0;
}
