/*
 * fork_util.h: forks while another thread keeps taking and giving back
 * blocks of an allocator's stock, and checks that each child can use the
 * stock: a child forked while the thread held the stock's mutex would wait
 * on it for ever unless fork() handlers take it first (recycle.h,
 * big_alloc.c). Each child has an alarm, so such a wait fails the test
 * instead of hanging it.
 */
#ifndef SL_TEST_FORK_UTIL_H
#define SL_TEST_FORK_UTIL_H

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <unistd.h>

struct fork_churn {
    void (*use)(void); /* takes a block of the stock and gives it back */
    atomic_bool stop;
};

static void *fork_churn_main(void *arg)
{
    struct fork_churn *c = arg;
    while (!atomic_load(&c->stop))
        c->use();
    return NULL;
}

/* Forks `forks` children while a thread runs use() in a loop; each child
 * runs use() once and exits 0, or is killed by its alarm after 20 s.
 * fill() first leaves several blocks in the stock, so that the thread,
 * which holds one at a time, never empties it and a child takes a kept
 * block rather than calling malloc: ASan's allocator is not safe to use in
 * a child forked from a process whose other thread may be inside it (a
 * child hung, or was handed a block the stock kept, in about 1 run in 40
 * of this test on a loaded machine). */
static inline void fork_while_used(void (*use)(void), void (*fill)(void), int forks)
{
    fill();
    struct fork_churn c = {.use = use};
    atomic_init(&c.stop, false);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, fork_churn_main, &c), 0);
    for (int i = 0; i < forks; i++) {
        pid_t pid = fork();
        cr_assert_geq(pid, 0, "fork failed");
        if (pid == 0) {
            alarm(20);
            use();
            _exit(0);
        }
        int st = 0;
        cr_assert_eq(waitpid(pid, &st, 0), pid);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            atomic_store(&c.stop, true);
            pthread_join(t, NULL);
            cr_assert_fail("child %d of %d: %s %d (a stock's mutex left locked by the fork?)", i, forks,
                    WIFSIGNALED(st) ? "killed by signal" : "exit status",
                    WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
        }
    }
    atomic_store(&c.stop, true);
    pthread_join(t, NULL);
}

#endif
