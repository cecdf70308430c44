/*
 * admin_api.h: the worker's admin endpoints (docs/admin-api.md).
 */
#ifndef SL_WADMIN_H
#define SL_WADMIN_H

#include "admin.h"
#include "worker.h"

/** Routes every worker endpoint of a to w. @return 0 or SL_ETOOBIG */
int sl_wadmin_register(sl_admin_t *a, sl_worker_t *w);

#endif
