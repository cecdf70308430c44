/*
 * policy.h: what the dispatcher reads from a dataset spec and from addresses
 * to apply the sharding policies, coordinated reads and target workers
 * (docs/sharding.md). Pure functions: state.c decides, these only look.
 */
#ifndef SL_DPOLICY_H
#define SL_DPOLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "spec.h"

/** @return the index of the first shard op whose num_shards is "hint", or -1 */
int sl_policy_hint_op(const sl_spec_t *spec);

/**
 * Whether the pipeline never ends: a repeat without count that no later
 * take bounds, over a source of known_elements > 0 (-1: not known yet,
 * taken as not empty).
 */
bool sl_policy_infinite(const sl_spec_t *spec, long long known_elements);

/**
 * How many times every pipeline of spec certainly reads its source whole:
 * the epochs its DYNAMIC tasks all ask splits for. The product of its
 * repeats' counts (UINT64_MAX for one forever), or 1 when an op may end an
 * iteration or the pipeline before the source's end (take) or reads the
 * source its own way (interleave, cache). The hand-out gives a task splits
 * of a later epoch than it asks for only below this many
 * (GetSplitRequest.cross_epochs): never of one its pipeline might not
 * reach, where they would go unread.
 */
uint64_t sl_policy_source_passes(const sl_spec_t *spec);

/**
 * Copies the host of "host:port" (brackets of an IPv6 host removed) into
 * host. @return 0, or -1 when addr has no port
 */
int sl_policy_host(const char *addr, char *host, size_t hostlen);

/** Whether worker address waddr is on host (its host part equals host). */
bool sl_policy_is_local(const char *waddr, const char *host);

#endif
