/*
 * vocab.c: names of the shared vocabulary of sluice.h (error codes, dtypes,
 * sharding policies). Part of libsluice's public API, so these functions are
 * exported even though protocol/ is built with hidden visibility.
 */
#define SL_BUILDING_LIBRARY 1
#include "sluice.h"

#include <string.h>

const char *sl_strerror(int err)
{
    switch (err) {
    case 0: return "success";
    case SL_EPROTO: return "protocol violation";
    case SL_EVERSION: return "protocol version mismatch";
    case SL_ETOOBIG: return "exceeds a configured limit";
    case SL_ESPEC: return "invalid dataset spec";
    case SL_ENOTFOUND: return "not found";
    case SL_ECONFLICT: return "conflicts with an existing job";
    case SL_EREMOTE: return "the peer reported an error";
    case SL_ECANCELLED: return "job cancelled";
    case SL_ECLOSED: return "connection closed";
    case SL_EINTERNAL: return "internal error";
    case SL_EDATA: return "pipeline failed on its data";
    case SL_EINVAL: return "invalid argument";
    case SL_EREFUSED: return "request refused";
    case SL_EPERM: return "not permitted: the sender does not own what it names";
    case SL_EAUTH: return "authentication failed";
    case SL_ELIMIT: return "a configured limit was reached";
    case SL_ENOHOST: return "cannot resolve the host name";
    default: break;
    }
    if (err < 0 && err > -4096)
        return strerror(-err);
    return "unknown error";
}

static const struct {
    const char *name;
    size_t size;
} dtypes[SL_DTYPE_COUNT_] = {
    [SL_DTYPE_INVALID] = {"invalid", 0}, [SL_DTYPE_BOOL] = {"bool", 1},
    [SL_DTYPE_INT8] = {"int8", 1},       [SL_DTYPE_INT16] = {"int16", 2},
    [SL_DTYPE_INT32] = {"int32", 4},     [SL_DTYPE_INT64] = {"int64", 8},
    [SL_DTYPE_UINT8] = {"uint8", 1},     [SL_DTYPE_UINT16] = {"uint16", 2},
    [SL_DTYPE_UINT32] = {"uint32", 4},   [SL_DTYPE_UINT64] = {"uint64", 8},
    [SL_DTYPE_FLOAT16] = {"float16", 2}, [SL_DTYPE_BFLOAT16] = {"bfloat16", 2},
    [SL_DTYPE_FLOAT32] = {"float32", 4}, [SL_DTYPE_FLOAT64] = {"float64", 8},
    [SL_DTYPE_BYTES] = {"bytes", 0},
};

const char *sl_dtype_name(sl_dtype_t dtype)
{
    return (unsigned)dtype < SL_DTYPE_COUNT_ ? dtypes[dtype].name : "invalid";
}

size_t sl_dtype_size(sl_dtype_t dtype)
{
    return (unsigned)dtype < SL_DTYPE_COUNT_ ? dtypes[dtype].size : 0;
}

static const char *shardings[SL_SHARDING_COUNT_] = {"off", "dynamic", "file", "data", "file_or_data", "hint"};

const char *sl_sharding_name(sl_sharding_t sharding)
{
    return (unsigned)sharding < SL_SHARDING_COUNT_ ? shardings[sharding] : NULL;
}

int sl_sharding_parse(const char *name, sl_sharding_t *out)
{
    for (int i = 0; i < SL_SHARDING_COUNT_; i++) {
        if (strcmp(name, shardings[i]) == 0) {
            *out = (sl_sharding_t)i;
            return 0;
        }
    }
    return SL_EINVAL;
}

static const char *targets[SL_TARGET_COUNT_] = {"any", "local"};

const char *sl_target_workers_name(sl_target_workers_t t)
{
    return (unsigned)t < SL_TARGET_COUNT_ ? targets[t] : NULL;
}

int sl_target_workers_parse(const char *name, sl_target_workers_t *out)
{
    for (int i = 0; i < SL_TARGET_COUNT_; i++) {
        if (strcmp(name, targets[i]) == 0) {
            *out = (sl_target_workers_t)i;
            return 0;
        }
    }
    return SL_EINVAL;
}

const char *sl_version(void)
{
    return SLUICE_VERSION;
}
