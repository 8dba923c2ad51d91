/*
 * The rows of config_table.h as the configuration engine's rows: where each
 * value lands in refit_config_t, and the list rows' item counts.
 */
#include "config/config_table.h"

#include "config/config.h"

#include <stddef.h>

/* A list row keeps its item count in MEMBER_count; other rows have none. */
#define REFIT_CONFIG_LIST_EXTRA_(member)                                                 \
  offsetof(refit_config_t, member##_count), sizeof(((refit_config_t *)0)->member[0])
#define REFIT_CONFIG_EXTRA_INT(member) 0, 0
#define REFIT_CONFIG_EXTRA_U64(member) 0, 0
#define REFIT_CONFIG_EXTRA_BYTES(member) 0, 0
#define REFIT_CONFIG_EXTRA_DOUBLE(member) 0, 0
#define REFIT_CONFIG_EXTRA_BOOL(member) 0, 0
#define REFIT_CONFIG_EXTRA_ENUM(member) 0, 0
#define REFIT_CONFIG_EXTRA_STRING(member) 0, 0
#define REFIT_CONFIG_EXTRA_STRING_LIST(member) REFIT_CONFIG_LIST_EXTRA_(member)
#define REFIT_CONFIG_EXTRA_SECTION(member) 0, 0

const refit_config_row_t refit_config_rows[] = {
#define REFIT_CONFIG_ROW_(id, section, key, type, member, def, min, max, choices, flags, \
                          doc)                                                           \
  {section "." key,                                                                      \
   section,                                                                              \
   key,                                                                                  \
   REFIT_CONFIG_TYPE_##type,                                                             \
   offsetof(refit_config_t, member),                                                     \
   sizeof(((refit_config_t *)0)->member),                                                \
   REFIT_CONFIG_EXTRA_##type(member),                                                    \
   def,                                                                                  \
   min,                                                                                  \
   max,                                                                                  \
   choices,                                                                              \
   flags,                                                                                \
   doc},
    REFIT_CONFIG_TABLE(REFIT_CONFIG_ROW_)
#undef REFIT_CONFIG_ROW_
};

const refit_config_table_t refit_config_table = {refit_config_rows,
                                                 REFIT_CONFIG_ROW_COUNT};

_Static_assert(sizeof(refit_config_rows) / sizeof(refit_config_rows[0]) ==
                   REFIT_CONFIG_ROW_COUNT,
               "one row per REFIT_CONFIG_ROW_ id");
_Static_assert(REFIT_CONFIG_ROW_COUNT <= REFIT_CONFIG_MAX_ROWS,
               "the engine takes the whole table");

/* Room for any value as YAML text: a quoted path or a quoted list, with every
 * byte escaped as \xNN in the worst case. */
_Static_assert(4 * REFIT_PATH_MAX + 8 <= REFIT_CONFIG_TEXT_MAX, "a quoted path fits");
_Static_assert(REFIT_QUANT_IGNORE_MAX *(4 * REFIT_MODULE_NAME_MAX + 4) + 8 <=
                   REFIT_CONFIG_TEXT_MAX,
               "a quoted list fits");
