// cjax::nn — see API.md; filled in by its family.
#pragma once
