/*
 * test_admin.c: the admin endpoint's helpers (common/admin.c): error
 * objects stay JSON whatever the client sent.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <string.h>

#include "admin.h"

static const char *error_text(json_t *o)
{
    cr_assert_not_null(o, "no error object");
    cr_assert(json_is_object(o));
    json_t *e = json_object_get(o, "error");
    cr_assert(json_is_string(e));
    return json_string_value(e);
}

/* A path of bytes that are not UTF-8 made jansson refuse the message, and
 * the 404 went out without a body (found by tests/fuzz/fuzz_admin.c). */
Test(admin_error, bytes_that_are_not_utf8_become_question_marks)
{
    json_t *o = sl_admin_error("no such endpoint: %s", "/v1/j\xff\xfe" "obs");
    cr_assert_str_eq(error_text(o), "no such endpoint: /v1/j??obs");
    json_decref(o);

    /* Overlong forms, surrogates, a lone continuation and a cut sequence. */
    o = sl_admin_error("%s|%s|%s|%s|%s", "\xc0\xaf", "\xed\xa0\x80", "\x80", "\xe2\x82", "\xf4\x90\x80\x80");
    cr_assert_str_eq(error_text(o), "??|???|?|??|????");
    json_decref(o);

    /* Valid UTF-8 stays as it is. */
    o = sl_admin_error("%s", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    cr_assert_str_eq(error_text(o), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    json_decref(o);
}

/* A long message is cut to its buffer, possibly inside a character. */
Test(admin_error, a_message_cut_inside_a_character_is_still_json)
{
    char path[1200];
    size_t n = 0;
    path[n++] = 'x';
    while (n + 2 < sizeof path) {
        path[n++] = '\xc3';
        path[n++] = '\xa9';
    }
    path[n] = '\0';
    for (int shift = 0; shift < 2; shift++) {
        json_t *o = sl_admin_error("%s", path + shift);
        const char *t = error_text(o);
        cr_assert(strlen(t) > 400);
        json_decref(o);
    }
}
