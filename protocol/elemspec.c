/*
 * elemspec.c: the element spec on the wire; see elemspec.h.
 */
#include <stdio.h>
#include <string.h>

#include "elemspec.h"

void sl_elemspec_to_wire(const sl_elemspec_t *in, sluice_ElementSpec *out)
{
    memset(out, 0, sizeof *out);
    out->known = in->known != 0;
    int n = in->num_components;
    if (!in->known || n < 0)
        n = 0;
    if (n > (int)(sizeof out->components / sizeof out->components[0]))
        n = (int)(sizeof out->components / sizeof out->components[0]);
    for (int i = 0; i < n; i++) {
        const sl_component_spec_t *c = &in->components[i];
        sluice_ComponentSpec *w = &out->components[i];
        snprintf(w->name, sizeof w->name, "%s", c->name);
        w->dtype = (uint32_t)c->dtype;
        w->rank = c->rank;
        w->ragged = c->ragged != 0;
        for (int d = 0; d < c->rank && d < SL_MAX_RANK; d++)
            w->shape[w->shape_count++] = c->shape[d];
    }
    out->components_count = (pb_size_t)n;
}

int sl_elemspec_from_wire(const sluice_ElementSpec *in, sl_elemspec_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (!in->known)
        return 0;
    if (in->components_count > SL_MAX_COMPONENTS)
        goto bad_count;
    for (pb_size_t i = 0; i < in->components_count; i++) {
        const sluice_ComponentSpec *w = &in->components[i];
        sl_component_spec_t *c = &out->components[i];
        size_t nlen = strnlen(w->name, sizeof w->name);
        if (nlen == 0 || nlen >= SL_MAX_NAME || w->dtype == SL_DTYPE_INVALID || w->dtype >= SL_DTYPE_COUNT_ ||
            w->rank < -1 || w->rank > SL_MAX_RANK || (w->rank >= 0 ? (int)w->shape_count != w->rank
                                                                     : w->shape_count != 0)) {
            snprintf(err, errlen, "element spec: component %u (name, dtype %u, rank %d with %u dimensions) is out "
                     "of range", (unsigned)i, (unsigned)w->dtype, (int)w->rank, (unsigned)w->shape_count);
            goto bad;
        }
        for (pb_size_t k = 0; k < i; k++) {
            if (strcmp(out->components[k].name, w->name) == 0) {
                snprintf(err, errlen, "element spec: component \"%s\" is there twice", w->name);
                goto bad;
            }
        }
        memcpy(c->name, w->name, nlen + 1);
        c->dtype = (sl_dtype_t)w->dtype;
        c->rank = w->rank;
        c->ragged = w->ragged;
        for (int d = 0; d < w->rank; d++) {
            if (w->shape[d] < -1) {
                snprintf(err, errlen, "element spec: component \"%s\" has dimension %lld", w->name,
                         (long long)w->shape[d]);
                goto bad;
            }
            c->shape[d] = w->shape[d];
        }
    }
    out->num_components = (int)in->components_count;
    out->known = 1;
    return 0;
bad_count:
    snprintf(err, errlen, "element spec: %u components, at most %d", (unsigned)in->components_count,
             SL_MAX_COMPONENTS);
bad:
    memset(out, 0, sizeof *out);
    return SL_EPROTO;
}
