/*
 * elemspec.h: a dataset's element spec (sl_elemspec_t, sluice.h) on the
 * wire (ElementSpec, sluice.proto), both ways. The decoder checks every
 * field, so a client keeps only what a well-formed answer can hold.
 */
#ifndef SL_ELEMSPEC_H
#define SL_ELEMSPEC_H

#include <stddef.h>

#include "sluice.h"
#include "sluice.pb.h"

/** Fills the wire form; sets nothing past its bounds (the spec's are the same). */
void sl_elemspec_to_wire(const sl_elemspec_t *in, sluice_ElementSpec *out);

/**
 * The wire form, checked: dtypes known, rank -1 .. SL_MAX_RANK with as many
 * dimensions (each >= -1), names non-empty and NUL-free, no name twice.
 * @return 0, or SL_EPROTO with the reason in err (out then says not known)
 */
int sl_elemspec_from_wire(const sluice_ElementSpec *in, sl_elemspec_t *out, char *err, size_t errlen);

#endif
