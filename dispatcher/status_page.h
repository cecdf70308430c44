/*
 * status_page.h: the dispatcher's status page (GET /), plain HTML and
 * JavaScript that reads the admin API and refreshes itself.
 */
#ifndef SL_STATUS_PAGE_H
#define SL_STATUS_PAGE_H

extern const char sl_status_page_html[];

#endif
