#include "ops.h"

namespace kog {

int64_t version() { return 6; }

}  // namespace kog
