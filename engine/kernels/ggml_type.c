/* ggml_type.c - the block type table: bytes and elements per block, names.
 * The sizes are those of the GGUF format (the file reader checks every
 * tensor's bytes against them). */
#include "ggml_type.h"

static const struct { uint32_t type; const char *name; size_t blck; size_t size; } type_table[] = {
    { GGML_F32, "F32", 1, 4 },      { GGML_F16, "F16", 1, 2 },
    { GGML_Q4_0, "Q4_0", 32, 18 },  { GGML_Q4_1, "Q4_1", 32, 20 },
    { GGML_Q5_0, "Q5_0", 32, 22 },  { GGML_Q5_1, "Q5_1", 32, 24 },
    { GGML_Q8_0, "Q8_0", 32, 34 },  { GGML_Q8_1, "Q8_1", 32, 36 },
    { GGML_Q2_K, "Q2_K", 256, 84 }, { GGML_Q3_K, "Q3_K", 256, 110 },
    { GGML_Q4_K, "Q4_K", 256, 144 }, { GGML_Q5_K, "Q5_K", 256, 176 },
    { GGML_Q6_K, "Q6_K", 256, 210 }, { GGML_Q8_K, "Q8_K", 256, 292 },
    { GGML_BF16, "BF16", 1, 2 },
    { 24, "I8", 1, 1 }, { 25, "I16", 1, 2 }, { 26, "I32", 1, 4 }, { 27, "I64", 1, 8 },
    { 28, "F64", 1, 8 },
};

static int type_index(uint32_t type)
{
    for (size_t i = 0; i < sizeof type_table / sizeof type_table[0]; i++)
        if (type_table[i].type == type)
            return (int)i;
    return -1;
}

size_t ggml_type_size(uint32_t type)
{
    int i = type_index(type);
    return i < 0 ? 0 : type_table[i].size;
}

size_t ggml_block_size(uint32_t type)
{
    int i = type_index(type);
    return i < 0 ? 0 : type_table[i].blck;
}

const char *ggml_type_name(uint32_t type)
{
    static const char *iq[] = { "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL",
                                "IQ3_S", "IQ2_S", "IQ4_XS" };
    int i = type_index(type);
    if (i >= 0)
        return type_table[i].name;
    if (type >= 16 && type <= 23)
        return iq[type - 16];
    switch (type) {
    case 29: return "IQ1_M";
    case 34: return "TQ1_0";
    case 35: return "TQ2_0";
    case 39: return "MXFP4";
    default: return "unknown";
    }
}
