/* slbadabi.c: a plugin built for another ABI version (the tests expect a refusal). */
#include "sluice_plugin.h"

static const sluice_plugin_t table = {SLUICE_PLUGIN_ABI_VERSION + 98, 0, NULL};

SLUICE_PLUGIN_EXPORT const sluice_plugin_t *sluice_plugin(void)
{
    return &table;
}
