/* The built-in chat templates (chat_builtin.c): each family's published
 * Jinja template, the special tokens it emits (which the tokenizer must
 * have), and its BOS/EOS for a tokenizer_config.json that names none. */
#ifndef MT_DATA_CHAT_BUILTIN_H
#define MT_DATA_CHAT_BUILTIN_H

typedef struct mt_chat_builtin {
    const char *name;
    const char *source;
    const char *needs[4];  // NULL-terminated
    const char *bos, *eos;
} mt_chat_builtin;

/* The built-in called name, or NULL. */
const mt_chat_builtin *mt_chat_builtin_find(const char *name);

#endif
