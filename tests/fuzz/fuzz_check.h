/*
 * fuzz_check.h: CHECK(cond) for the fuzz targets: a property the target
 * promises that does not hold aborts, naming the file, line and condition,
 * so that libFuzzer keeps the input (and the replay test fails on it).
 */
#ifndef SL_FUZZ_CHECK_H
#define SL_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                                                          \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);                         \
            abort();                                                                                         \
        }                                                                                                    \
    } while (0)

#endif
