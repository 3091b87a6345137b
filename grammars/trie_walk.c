/* The token trie walked depth-first through a byte automaton's walk table (grammars/masks.py
 * describes the table's value encoding: 0 dead, (s+1)*256 state s, -1 a row not filled yet).
 *
 * Nodes are in preorder, so a node's subtree is the `size[i]` nodes from i: a dead node skips
 * its subtree in one step, and `vals[d]` holds the value of the current node of depth d (its
 * ancestors are the nodes last seen at each smaller depth). Every alive node sets the bits of
 * the tokens its prefix spells. A node whose parent's row is not filled yet is handed back
 * with its subtree unwalked; the caller fills the rows and hands those nodes back as roots.
 */
#include <stdint.h>

struct trie { /* the index's preorder arrays (tokenizer_index.py) */
    const uint8_t *byte;
    const int32_t *depth;
    const int32_t *size;
    const int32_t *token; /* the token a node spells, or a bit past the mask's last word */
    int64_t max_depth;
};

/* Walk the subtrees of `roots` (pairs: preorder number, its parent's value; for node 0, the
 * root, its own value) and set the bits of the tokens alive in `words`. `scratch` holds
 * max_depth + 1 values, then the pending pairs (preorder number, parent's value) written here;
 * returns how many. */
int64_t rf_trie_walk(const int32_t *flat, int64_t flat_len, const struct trie *t,
                     const int32_t *roots, int64_t num_roots, int32_t *scratch,
                     uint32_t *words) {
    const uint8_t *byte = t->byte;
    const int32_t *depth = t->depth, *size = t->size;
    const int32_t *token = t->token;
    int32_t *vals = scratch, *pending = scratch + t->max_depth + 1;
    int64_t num_pending = 0;
    for (int64_t r = 0; r < num_roots; r++) {
        int64_t i = roots[2 * r];
        const int64_t end = i + size[i];
        if (i == 0) {
            vals[0] = roots[2 * r + 1];
            i++;
        } else {
            vals[depth[i] - 1] = roots[2 * r + 1];
        }
        while (i < end) {
            const int32_t d = depth[i];
            const int32_t parent = vals[d - 1];
            const int64_t at = (int64_t)parent + byte[i];
            const int32_t v = at < flat_len ? flat[at] : -1;
            if (v > 0) {
                vals[d] = v;
                words[token[i] >> 5] |= 1u << (token[i] & 31);
                i++;
            } else {
                if (v < 0) {
                    pending[2 * num_pending] = (int32_t)i;
                    pending[2 * num_pending + 1] = parent;
                    num_pending++;
                }
                i += size[i];
            }
        }
    }
    return num_pending;
}
