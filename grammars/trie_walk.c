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
 *
 * Text subtrees (the numpy walk's shortcut, `masks`): a node whose prefix is whole characters
 * of text (`phase` 0) and whose state reads text (every text byte of each UTF-8 phase leads to
 * one state, back to the node's own after each whole character: `reads_text`) has every text
 * token of its subtree alive. Their bits are or-ed in from a packed row where the subtree has
 * one (`words_of`), else set node by node in preorder without reading a row; only the nodes
 * that are not text are walked, from each rough root (a node that is not text under a text
 * parent; `rough_next` finds the next one) and its parent's state by phase.
 *
 * A state from which every string of text can be read (`any_text`: the names an object allows
 * beside its declared ones, where each prefix of a declared name is a state of its own) has
 * every text token of a text subtree alive too, whatever states the text leads through: their
 * bits are taken the same way, and the walk steps only down the text nodes above a rough root,
 * to give each rough root its parent's state (`absorb_any`).
 */
/*
 * A grammar automaton's lexer beside its parser states (`lexer_side`, NULL for other automata):
 * a parser state of one element (Earley set `node`, lexer state `lex`) whose row is not made
 * yet reads on as its lexer does, so the walk steps through the lexer's rows (shared by every
 * Earley set) as pairs (node, lexer state) instead of making a parser state for each: most
 * states of a first walk (each prefix of each name an object declares) are such pairs. A pair
 * becomes its parser state (`state_of`) where its lexer state ends a terminal (the parser
 * takes over) and where the node's subtree is large enough for the text shortcuts, which read
 * parser states; `nodes[d]` is the pair's node at depth d, -1 where `states[d]` is a parser
 * state. The mask is the same: the parser state of a pair whose lexer state ends no terminal
 * is that one element, alive while the lexer state is.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NOT_TEXT 255
#define MAX_PHASES 32
#define ABSORB_MIN_SIZE 16 /* a smaller subtree costs less to walk than to look at */

struct trie { /* the index's preorder arrays (tokenizer_index.py, native_walk.py) */
    const uint8_t *byte;
    const int32_t *depth;
    const int32_t *size;
    const int32_t *token; /* the token a node spells, or a bit past the mask's last word */
    int64_t max_depth;
    const uint8_t *phase;      /* where in a UTF-8 character the prefix ends, NOT_TEXT if no text */
    const int32_t *rough_next; /* the first rough root at or after each node, num_nodes if none */
    const uint8_t *up_phase;   /* of a rough root: its parent's phase */
    const int32_t *words_of;   /* per node: its row of `text_words`, -1 where it has none */
    const uint32_t *text_words; /* rows of `num_words`: the text tokens of a subtree */
    int64_t num_words;
    const uint8_t *next_phase; /* [num_phases][256]: the phase after a byte, NOT_TEXT if none */
    int64_t num_phases;
};

/* Per automaton state, what the walk learnt of it (kept between walks by the caller):
 * `index[s]` 0 unknown, -1 does not read text, k > 0 reads text with the states of each phase
 * in `states[(k - 1) * num_phases ...]`. States past `cap` or past `rows_cap` rows are worked
 * out again each time (the caller grows both between walks). `any_text[s]` is 1 where every
 * string of text can be read from s (the automaton's, for its first `any_text_cap` states). */
struct text_cache {
    int32_t *index;
    int64_t cap;
    int32_t *states;
    int64_t rows_cap;
    int64_t *rows_used;
    const uint8_t *any_text;
    int64_t any_text_cap;
};

typedef int64_t (*fill_row)(int32_t state, int64_t *num_rows);

struct lexer_side { /* dfa_rows.c's callbacks for the walk's grammar automaton */
    /* the lexer state of a parser state with one element (its Earley set in `*node`), -1 when
     * it has another number of elements, -2 on error */
    int32_t (*single)(int32_t state, int32_t *node);
    /* the lexer rows' addresses once `lex`'s row is made, their number in `*num_rows`; 0 on
     * error */
    int64_t (*lex_fill)(int32_t lex, int64_t *num_rows);
    /* 1 where lexer state `lex` ends a terminal, 0 where not, -1 on error */
    int (*ends)(int32_t lex);
    /* the parser state the pair (node, lex) stands for, -2 on error */
    int32_t (*state_of)(int32_t node, int32_t lex);
    /* 1 where every string of text can be read from lexer state `lex`, 0 where not, -1 on
     * error */
    int (*any_text)(int32_t lex);
};

struct walk {
    const int64_t *rows;
    int64_t num_rows;
    const struct trie *t;
    int32_t *states;
    uint32_t *words;
    fill_row fill;
    struct text_cache *cache;
    int64_t steps; /* nodes stepped through (returned: the tests see which way a walk went) */
    const struct lexer_side *lexer; /* NULL: no pairs */
    int32_t *nodes;                 /* per depth: a pair's Earley set, -1 for a parser state */
    const int64_t *lex_rows;
    int64_t num_lex_rows;
    uint8_t *lex_ends; /* per lexer state met: 0 unknown, 1 ends no terminal, 2 ends one */
    int64_t num_lex_ends;
};

/* The row of `state` (computed now where it is not yet), or 0 when that failed. */
static const int32_t *row_of(struct walk *w, int32_t state) {
    const int32_t *row = state < w->num_rows ? (const int32_t *)w->rows[state] : 0;
    if (!row) {
        w->rows = (const int64_t *)w->fill(state, &w->num_rows);
        row = w->rows && state < w->num_rows ? (const int32_t *)w->rows[state] : 0;
    }
    return row;
}

/* The row of lexer state `lex` (made now where it is not yet), or 0 when that failed. */
static const int32_t *lex_row_of(struct walk *w, int32_t lex) {
    const int32_t *row = lex < w->num_lex_rows ? (const int32_t *)w->lex_rows[lex] : 0;
    if (!row) {
        w->lex_rows = (const int64_t *)w->lexer->lex_fill(lex, &w->num_lex_rows);
        row = w->lex_rows && lex < w->num_lex_rows ? (const int32_t *)w->lex_rows[lex] : 0;
    }
    return row;
}

/* Sets depth d's state to parser state `state` (not a pair). */
static void set_state(struct walk *w, int64_t d, int32_t state) {
    w->states[d] = state;
    if (w->nodes) w->nodes[d] = -1;
}

/* Whether `state` (a lexer state where `lexer`) reads text: 1 with its state per phase in
 * `out`, 0 not, -1 failed. */
static int work_out_text(struct walk *w, int32_t state, int32_t *out, int lexer) {
    const struct trie *t = w->t;
    for (int64_t p = 0; p < t->num_phases; p++) out[p] = -1;
    out[0] = state;
    for (int64_t p = 0; p < t->num_phases; p++) { /* phases are numbered in the order reached */
        if (out[p] < 0) return 0;
        const int32_t *row = lexer ? lex_row_of(w, out[p]) : row_of(w, out[p]);
        if (!row) return -1;
        const uint8_t *next = t->next_phase + p * 256;
        for (int b = 0; b < 256; b++) {
            if (next[b] == NOT_TEXT) continue;
            const int32_t s = row[b];
            if (s < 0 || (out[next[b]] >= 0 && out[next[b]] != s)) return 0;
            out[next[b]] = s;
        }
    }
    return 1;
}

/* The state per phase of a state that reads text (in the cache or `scratch`), NULL when it
 * does not; sets `*failed` when a row could not be made. */
static const int32_t *reads_text(struct walk *w, int32_t state, int32_t *scratch, int *failed) {
    struct text_cache *c = w->cache;
    const int64_t phases = w->t->num_phases;
    if (state < c->cap && c->index[state] != 0)
        return c->index[state] < 0 ? 0 : c->states + (c->index[state] - 1) * phases;
    const int got = work_out_text(w, state, scratch, 0);
    if (got < 0) {
        *failed = 1;
        return 0;
    }
    if (state >= c->cap) return got ? scratch : 0;
    if (!got) {
        c->index[state] = -1;
        return 0;
    }
    if (*c->rows_used == c->rows_cap) return scratch;
    int32_t *kept = c->states + *c->rows_used * phases;
    memcpy(kept, scratch, phases * sizeof(int32_t));
    c->index[state] = (int32_t)++*c->rows_used;
    return kept;
}

/* Whether lexer state `lex` ends a terminal (asked once per walk): 1, 0, or -1 on error. */
static int lexer_ends(struct walk *w, int32_t lex) {
    if (lex >= w->num_lex_ends) {
        int64_t n = w->num_lex_ends ? w->num_lex_ends : 256;
        while (n <= lex) n *= 2;
        uint8_t *grown = realloc(w->lex_ends, n);
        if (grown == NULL) return -1;
        memset(grown + w->num_lex_ends, 0, n - w->num_lex_ends);
        w->lex_ends = grown;
        w->num_lex_ends = n;
    }
    if (!w->lex_ends[lex]) {
        const int ends = w->lexer->ends(lex);
        if (ends < 0) return -1;
        w->lex_ends[lex] = (uint8_t)(1 + ends);
    }
    return w->lex_ends[lex] - 1;
}

/* Whether lexer state `lex` reads text or any text (where a parser state of it alone may):
 * 1, 0, or -1 on error. */
static int lex_text_like(struct walk *w, int32_t lex) {
    int32_t scratch[MAX_PHASES];
    const int any = w->lexer->any_text(lex);
    return any != 0 ? any : work_out_text(w, lex, scratch, 1);
}

/* Where depth d holds a parser state of one element whose row is not made, turns it into its
 * pair, whose children the lexer's rows give; with `plain` only where its lexer state reads no
 * text (at a big subtree's root: then neither does the parser state, and the text shortcuts,
 * which would make its row, cannot apply). 1 a pair now, 0 not, -1 on error. */
static int to_pair(struct walk *w, int64_t d, int plain) {
    const int32_t s = w->states[d];
    if (!w->nodes || w->nodes[d] >= 0 || (s < w->num_rows && w->rows[s])) return 0;
    int32_t node;
    const int32_t lex = w->lexer->single(s, &node);
    if (lex < 0) return lex == -2 ? -1 : 0;
    const int text = plain ? lex_text_like(w, lex) : 0;
    if (text != 0) return text < 0 ? -1 : 0;
    w->states[d] = lex;
    w->nodes[d] = node;
    return 1;
}

/* The child of depth d - 1's pair by `byte` into depth d: a pair where its lexer state ends no
 * terminal, else its parser state; at the root of a `big` subtree (where the text shortcuts
 * apply) its parser state too where the lexer state reads text or any text, as the shortcuts
 * need. 1 alive, 0 dead, -1 on error. */
static int pair_step(struct walk *w, int64_t d, uint8_t byte, int big) {
    const int32_t *row = lex_row_of(w, w->states[d - 1]);
    if (!row) return -1;
    const int32_t lex = row[byte];
    if (lex < 0) return 0;
    int ends = lexer_ends(w, lex);
    if (!ends && big) ends = lex_text_like(w, lex);
    if (ends < 0) return -1;
    if (!ends) {
        w->states[d] = lex;
        w->nodes[d] = w->nodes[d - 1];
        return 1;
    }
    const int32_t s = w->lexer->state_of(w->nodes[d - 1], lex);
    if (s == -2) return -1;
    set_state(w, d, s);
    return s >= 0;
}

static void set_bit(uint32_t *words, int32_t token) { words[token >> 5] |= 1u << (token & 31); }

static int walk_nodes(struct walk *w, int64_t lo, int64_t hi);

/* Or-s in the packed row of text node `i`'s text tokens, where it has one; returns its row
 * number, -1 where it has none (its tokens' bits are then set node by node). */
static int32_t or_text_row(struct walk *w, int64_t i) {
    const struct trie *t = w->t;
    const int32_t rows = t->words_of[i];
    if (rows >= 0) {
        const uint32_t *src = t->text_words + (int64_t)rows * t->num_words;
        for (int64_t k = 0; k < t->num_words; k++) w->words[k] |= src[k];
    }
    return rows;
}

/* The subtree of text node `i` under text states `by_phase`: its text tokens alive, the rough
 * roots in it walked. 0, or -1 when a row could not be made. */
static int absorb(struct walk *w, int64_t i, const int32_t *by_phase) {
    const struct trie *t = w->t;
    const int64_t end = i + t->size[i];
    const int32_t rows = or_text_row(w, i);
    int32_t state_copy[MAX_PHASES]; /* the cache may hand out `by_phase` from scratch space */
    memcpy(state_copy, by_phase, t->num_phases * sizeof(int32_t));
    for (int64_t j = i + 1; j < end;) {
        int64_t r = t->rough_next[j];
        if (r > end) r = end;
        if (rows < 0) {
            for (int64_t k = j; k < r; k++) set_bit(w->words, t->token[k]);
            w->steps += r - j;
        }
        if (r == end) break;
        set_state(w, t->depth[r] - 1, state_copy[t->up_phase[r]]);
        if (walk_nodes(w, r, r + t->size[r]) < 0) return -1;
        j = r + t->size[r];
    }
    return 0;
}

/* Whether every string of text can be read from `state`, and the walk does not know it to read
 * text (whose subtrees `absorb` takes without stepping down to their rough roots). */
static int reads_any_text(const struct walk *w, int32_t state) {
    const struct text_cache *c = w->cache;
    return state < c->any_text_cap && c->any_text[state] && !(state < c->cap && c->index[state] > 0);
}

/* The subtree of text node `i` under a state that reads any text (`states[depth[i]]`): its text
 * tokens alive, each text node above a rough root stepped through for its state, and the rough
 * roots walked from their parents' states. 0, or -1 when a row could not be made (or a text
 * byte was dead there: the automaton contradicts its `any_text`). */
static int absorb_any(struct walk *w, int64_t i) {
    const struct trie *t = w->t;
    const int64_t end = i + t->size[i];
    const int32_t rows = or_text_row(w, i);
    for (int64_t j = i + 1; j < end;) {
        const int64_t r = t->rough_next[j], past = j + t->size[j];
        if (r == j) { /* a rough root: walked from its parent's state */
            if (walk_nodes(w, j, past) < 0) return -1;
            j = past;
        } else if (r >= past) { /* text only below: alive, not stepped through */
            if (rows < 0) {
                for (int64_t k = j; k < past; k++) set_bit(w->words, t->token[k]);
                w->steps += past - j;
            }
            j = past;
        } else { /* text above a rough root: its state, from its parent's */
            const int32_t *row = row_of(w, w->states[t->depth[j] - 1]);
            if (!row || row[t->byte[j]] < 0) return -1;
            set_state(w, t->depth[j], row[t->byte[j]]);
            if (rows < 0) set_bit(w->words, t->token[j]);
            w->steps++;
            j++;
        }
    }
    return 0;
}

/* Walk nodes lo..hi (whole subtrees, `states` set for their parents' depth). */
static int walk_nodes(struct walk *w, int64_t lo, int64_t hi) {
    const struct trie *t = w->t;
    const uint8_t *byte = t->byte;
    const int32_t *depth = t->depth, *size = t->size, *token = t->token;
    int32_t scratch[MAX_PHASES];
    for (int64_t i = lo; i < hi;) {
        const int32_t d = depth[i];
        int32_t s;
        if (w->nodes && w->nodes[d - 1] >= 0) { /* a pair: its lexer's row */
            const int alive = pair_step(w, d, byte[i], size[i] >= ABSORB_MIN_SIZE && t->phase[i] == 0);
            if (alive < 0) return -1;
            w->steps++;
            if (!alive) {
                i += size[i];
                continue;
            }
            set_bit(w->words, token[i]);
            if (w->nodes[d] >= 0) {
                i++;
                continue;
            }
            s = w->states[d];
        } else {
            const int32_t *row = row_of(w, w->states[d - 1]);
            if (!row) return -1; /* failed, or made no row: never loop on it */
            s = row[byte[i]];
            w->steps++;
            if (s < 0) {
                i += size[i];
                continue;
            }
            set_state(w, d, s);
            set_bit(w->words, token[i]);
            if (w->nodes && size[i] >= ABSORB_MIN_SIZE && t->phase[i] == 0) {
                const int paired = to_pair(w, d, 1);
                if (paired < 0) return -1;
                if (paired) {
                    i++;
                    continue;
                }
            }
        }
        if (size[i] >= ABSORB_MIN_SIZE && t->phase[i] == 0 && reads_any_text(w, s)) {
            if (absorb_any(w, i) < 0) return -1;
            i += size[i];
            continue;
        }
        if (size[i] >= ABSORB_MIN_SIZE && t->phase[i] == 0) {
            int failed = 0;
            const int32_t *by_phase = reads_text(w, s, scratch, &failed);
            if (failed) return -1;
            if (by_phase) {
                if (absorb(w, i, by_phase) < 0) return -1;
                i += size[i];
                continue;
            }
        }
        if (to_pair(w, d, 0) < 0) return -1;
        i++;
    }
    return 0;
}

static int64_t walk_from(struct walk *w, int32_t state) {
    const struct trie *t = w->t;
    set_state(w, 0, state);
    if (reads_any_text(w, state)) return absorb_any(w, 0) < 0 ? -1 : w->steps;
    int failed = 0;
    int32_t scratch[MAX_PHASES];
    const int32_t *by_phase = reads_text(w, state, scratch, &failed);
    if (failed) return -1;
    if (by_phase) return absorb(w, 0, by_phase) < 0 ? -1 : w->steps;
    if (to_pair(w, 0, 0) < 0) return -1;
    return walk_nodes(w, 1, t->size[0]) < 0 ? -1 : w->steps;
}

/* Walk the whole trie from `state` and set the bits of the tokens alive in `words`; `states`
 * holds max_depth + 1 states; `lexer`: a grammar automaton's (pairs, see above), or NULL.
 * Returns the nodes it stepped through, or -1 when `fill` (or a `lexer` callback) failed. */
int64_t rf_trie_walk(const int64_t *rows, int64_t num_rows, const struct trie *t, int32_t state,
                     int32_t *states, uint32_t *words, fill_row fill, struct text_cache *cache,
                     const struct lexer_side *lexer) {
    if (t->num_phases > MAX_PHASES) return -1;
    struct walk w = {rows, num_rows, t, states, words, fill, cache, 0, lexer, NULL, NULL, 0, NULL, 0};
    if (lexer && (w.nodes = malloc((t->max_depth + 1) * sizeof(int32_t))) == NULL) return -1;
    const int64_t steps = walk_from(&w, state);
    free(w.nodes);
    free(w.lex_ends);
    return steps;
}
