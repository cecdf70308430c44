/*
 * admin_api.h: the dispatcher's admin endpoints (docs/admin-api.md).
 */
#ifndef SL_DADMIN_H
#define SL_DADMIN_H

#include "admin.h"
#include "state.h"

/** Routes every dispatcher endpoint of a to st. @return 0 or SL_ETOOBIG */
int sl_dadmin_register(sl_admin_t *a, sl_dstate_t *st);

#endif
