"""LibMTL's NYUv2 task head (`model.head: aspp`): DeepLabV3's head on the encoder map.

LibMTL's NYUv2 example decodes every task with a DeepLabV3 head (its `DeepLabHead`, in
`examples/nyu/aspp.py` and later `LibMTL/model/decoder/DeepLabHead.py`): atrous spatial
pyramid pooling (a 1x1 branch, three 3x3 branches at dilation 12, 24 and 36 and an image-pooling
branch, each conv-BN-ReLU at 256 channels, concatenated and projected by conv1x1-BN-ReLU and
dropout 0.5), then conv3x3-BN-ReLU and a conv1x1 prediction, resized to the image with
`align_corners=True`. That is torchvision's DeepLabV3 head, whose `ASPP` module is used here.

The decoder feature map (whose channel-wise L2 norm is the depth/normal audit score) is the
output of the conv3x3-BN-ReLU after the ASPP, the same place as in the simple head. The width
is `model.head_channels` (256 in LibMTL and in `configs/nyuv2-libmtl.yaml`).
"""

from __future__ import annotations

from torch import Tensor, nn

ATROUS_RATES = (12, 24, 36)
"""The dilations of DeepLabV3's (and LibMTL's) three 3x3 ASPP branches."""


class AsppHead(nn.Module):
    """ASPP -> conv3x3-BN-ReLU (the decoder feature map) -> conv1x1."""

    align_corners = True
    """LibMTL resizes each prediction to the image with `align_corners=True`."""

    def __init__(self, in_channels: int, width: int, out_channels: int) -> None:
        from torchvision.models.segmentation.deeplabv3 import ASPP  # deferred: torchvision

        super().__init__()
        self.decoder = nn.Sequential(
            ASPP(in_channels, list(ATROUS_RATES), width),
            nn.Conv2d(width, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
        )
        self.predict = nn.Conv2d(width, out_channels, 1)

    def forward(self, encoded: Tensor) -> tuple[Tensor, Tensor]:
        features = self.decoder(encoded)
        return self.predict(features), features
