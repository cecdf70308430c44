/* slnoentry.c: a shared object without the entry point (the tests expect a refusal). */
#include "sluice_plugin.h"

SLUICE_PLUGIN_EXPORT int not_a_plugin(void)
{
    return 0;
}
