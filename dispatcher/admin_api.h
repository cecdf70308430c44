/*
 * admin_api.h: the dispatcher's admin endpoints (docs/admin-api.md).
 */
#ifndef SL_DADMIN_H
#define SL_DADMIN_H

#include "admin.h"
#include "server.h"

/** Routes every dispatcher endpoint of a to the server's state; the
 *  endpoints that change it commit before they answer.
 *  @return 0 or SL_ETOOBIG */
int sl_dadmin_register(sl_admin_t *a, sl_dserver_t *srv);

#endif
