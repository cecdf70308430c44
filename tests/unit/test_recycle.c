/* test_recycle.c: the stock of same-size blocks (common/recycle.h). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>

#include "fork_util.h"
#include "recycle.h"

#define BLOCK 6144

Test(recycle, a_block_given_back_is_the_next_one_handed_out)
{
    sl_recycler_t r = SL_RECYCLER_INIT(BLOCK);
    uint8_t *a = sl_recycle_alloc(&r);
    cr_assert_not_null(a);
    memset(a, 7, BLOCK); /* the whole size is usable */
    cr_assert_eq(sl_recycle_kept(&r), 0);
    sl_recycle_free(&r, a);
    cr_assert_eq(sl_recycle_kept(&r), 1);
    uint8_t *b = sl_recycle_alloc(&r);
    cr_assert_eq(b, a, "the kept block was not handed out again");
    cr_assert_eq(sl_recycle_kept(&r), 0);
    memset(b, 9, BLOCK);
    sl_recycle_free(&r, b);
    sl_recycle_free(&r, NULL); /* nothing */
    cr_assert_eq(sl_recycle_kept(&r), 1);
    sl_recycle_drain(&r);
    cr_assert_eq(sl_recycle_kept(&r), 0);
}

/* More blocks than the stock holds: the rest go back to malloc (LSan at
 * exit would name any that went nowhere), and the drain frees the kept. */
Test(recycle, what_is_kept_is_bounded)
{
    sl_recycler_t r = SL_RECYCLER_INIT(BLOCK);
    enum { N = SL_RECYCLE_SLOTS * 3 };
    void *p[N];
    for (int i = 0; i < N; i++)
        cr_assert_not_null(p[i] = sl_recycle_alloc(&r));
    for (int i = 0; i < N; i++)
        sl_recycle_free(&r, p[i]);
    cr_assert_eq(sl_recycle_kept(&r), SL_RECYCLE_SLOTS);
    sl_recycle_drain(&r);
    cr_assert_eq(sl_recycle_kept(&r), 0);
}

/* A block is allocated on one thread and given back on another (a wire
 * batch: the pipeline's thread and the loop's). Each thread writes its mark
 * over the whole block it holds and checks it before giving it back: a block
 * handed to two owners at once would show the other's mark. */
struct churn {
    sl_recycler_t *r;
    uint8_t mark;
    int bad;
};

static void *churn_main(void *arg)
{
    struct churn *c = arg;
    void *held[8] = {0};
    for (int i = 0; i < 200000; i++) {
        int k = i % 8;
        if (held[k]) {
            const uint8_t *b = held[k];
            for (int j = 0; j < BLOCK; j += 512)
                c->bad += b[j] != c->mark;
            sl_recycle_free(c->r, held[k]);
        }
        uint8_t *b = held[k] = sl_recycle_alloc(c->r);
        if (!b)
            return NULL;
        for (int j = 0; j < BLOCK; j += 512)
            b[j] = c->mark;
    }
    for (int k = 0; k < 8; k++)
        sl_recycle_free(c->r, held[k]);
    return NULL;
}

Test(recycle, threads_never_share_a_block)
{
    static sl_recycler_t r = SL_RECYCLER_INIT(BLOCK);
    struct churn c[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        c[i] = (struct churn){&r, (uint8_t)(i + 1), 0};
        cr_assert_eq(pthread_create(&t[i], NULL, churn_main, &c[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        cr_assert_eq(c[i].bad, 0, "thread %d saw another's mark in a block it held", i);
    }
    cr_assert_leq(sl_recycle_kept(&r), SL_RECYCLE_SLOTS);
    sl_recycle_drain(&r);
}

static sl_recycler_t fork_stock = SL_RECYCLER_INIT(BLOCK);

static void use_fork_stock(void)
{
    sl_recycle_free(&fork_stock, sl_recycle_alloc(&fork_stock));
}

static void fill_fork_stock(void)
{
    void *b[4];
    for (int i = 0; i < 4; i++)
        cr_assert_not_null(b[i] = sl_recycle_alloc(&fork_stock));
    for (int i = 0; i < 4; i++)
        sl_recycle_free(&fork_stock, b[i]);
    cr_assert_eq(sl_recycle_kept(&fork_stock), 4);
}

/* A trainer may fork its data loaders while a thread streams: the child
 * finds the stock unlocked (checked by mutation: without the fork handlers
 * a child waits on the mutex and its alarm fails the test). */
Test(recycle, a_child_forked_while_a_thread_uses_a_stock_can_use_it)
{
    cr_assert_eq(sl_recycle_register(&fork_stock), 0);
    fork_while_used(use_fork_stock, fill_fork_stock, 300);
    sl_recycle_drain(&fork_stock);
}

Test(recycle, registration_takes_a_bounded_number_of_stocks)
{
    static sl_recycler_t many[SL_RECYCLE_STOCKS + 1];
    int refused = 0;
    for (int i = 0; i <= SL_RECYCLE_STOCKS; i++) {
        many[i] = (sl_recycler_t)SL_RECYCLER_INIT(BLOCK);
        refused += sl_recycle_register(&many[i]) < 0;
    }
    cr_assert_geq(refused, 1, "more stocks than SL_RECYCLE_STOCKS were taken");
}

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
/* Under ASan a kept block is poisoned (a use after the give-back is
 * caught) until it is handed out again; a second give-back aborts. */
Test(recycle, a_kept_block_is_poisoned_until_handed_out)
{
    sl_recycler_t r = SL_RECYCLER_INIT(BLOCK);
    uint8_t *a = sl_recycle_alloc(&r);
    cr_assert_null(__asan_region_is_poisoned(a, BLOCK), "a new block is poisoned");
    sl_recycle_free(&r, a);
    cr_assert_eq(__asan_region_is_poisoned(a, BLOCK), a, "a kept block can be read");
    uint8_t *b = sl_recycle_alloc(&r);
    cr_assert_eq(b, a);
    cr_assert_null(__asan_region_is_poisoned(b, BLOCK), "a block handed out again is still poisoned");
    sl_recycle_free(&r, b);
    sl_recycle_drain(&r);
}

Test(recycle, a_block_given_back_twice_aborts, .signal = SIGABRT)
{
    static sl_recycler_t r = SL_RECYCLER_INIT(BLOCK);
    void *a = sl_recycle_alloc(&r);
    sl_recycle_free(&r, a);
    sl_recycle_free(&r, a);
    cr_assert_fail("a block given back twice was taken into the stock again");
}
#endif
