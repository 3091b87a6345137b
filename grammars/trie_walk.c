/* The token trie walked depth-first through a byte automaton's rows, read where the automaton
 * keeps them: `rows[s]` is the address of state s's int32[256] successors (-1 dead), 0 while
 * the row is not computed yet.
 *
 * Nodes are in preorder, so a node's subtree is the `size[i]` nodes from i: a dead node skips
 * its subtree in one step, and `states[d]` holds the state of the current node of depth d (its
 * ancestors are the nodes last seen at each smaller depth). Every alive node sets the bit of
 * the token its prefix spells. A node whose parent's row is not computed yet is handed back
 * with its subtree unwalked; the caller computes the rows and hands those nodes back as roots.
 */
#include <stdint.h>

struct trie { /* the index's preorder arrays (tokenizer_index.py) */
    const uint8_t *byte;
    const int32_t *depth;
    const int32_t *size;
    const int32_t *token; /* the token a node spells, or a bit past the mask's last word */
    int64_t max_depth;
};

/* Walk the subtrees of `roots` (pairs: preorder number, its parent's state; for node 0, the
 * root, its own state) and set the bits of the tokens alive in `words`. `scratch` holds
 * max_depth + 1 states, then room for the pending pairs (preorder number, parent's state) and
 * then for the states whose rows they wait for, written here (2 and 1 slots per trie node);
 * returns how many pairs, and the number of those states in `*num_missing` (each once when
 * its nodes come one after another, as siblings do: a dense state hands back tens of thousands
 * of nodes waiting for a few rows). */
int64_t rf_trie_walk(const int64_t *rows, int64_t num_rows, const struct trie *t,
                     const int32_t *roots, int64_t num_roots, int32_t *scratch,
                     uint32_t *words, int64_t *num_missing) {
    const uint8_t *byte = t->byte;
    const int32_t *depth = t->depth, *size = t->size;
    const int32_t *token = t->token;
    int32_t *states = scratch, *pending = scratch + t->max_depth + 1;
    int32_t *missing = pending + 2 * (int64_t)size[0];
    int64_t num_pending = 0;
    *num_missing = 0;
    for (int64_t r = 0; r < num_roots; r++) {
        int64_t i = roots[2 * r];
        const int64_t end = i + size[i];
        if (i == 0) {
            states[0] = roots[2 * r + 1];
            i++;
        } else {
            states[depth[i] - 1] = roots[2 * r + 1];
        }
        while (i < end) {
            const int32_t d = depth[i];
            const int32_t parent = states[d - 1];
            const int32_t *row = parent < num_rows ? (const int32_t *)rows[parent] : 0;
            if (!row) {
                pending[2 * num_pending] = (int32_t)i;
                pending[2 * num_pending + 1] = parent;
                num_pending++;
                if (*num_missing == 0 || missing[*num_missing - 1] != parent)
                    missing[(*num_missing)++] = parent;
                i += size[i];
                continue;
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
    }
    return num_pending;
}
